#include "zero/layout.h"

#include <algorithm>

namespace strata::zero {
namespace {

// Tensor ids in the order modules first use them: the order they are laid out in.
std::vector<TensorId> PlacementOrder(const ModelDecl& model) {
  std::vector<uint8_t> seen(model.tensors.size(), 0);
  std::vector<TensorId> order;
  for (const ModuleDecl& m : model.modules) {
    for (TensorId id : m.tensors) {
      if (!seen[id]) order.push_back(id);
      seen[id] = 1;
    }
  }
  return order;
}

void FindGaps(Layout& l) {
  l.chunk_gaps.assign(l.num_chunks, {});
  for (int c = 0; c < l.num_chunks; ++c) {
    int64_t end = 0;
    for (TensorId id : l.chunk_tensors[c]) {  // in placement order: ascending offsets
      const TensorPlace& t = l.tensors[id];
      if (t.offset > end) l.chunk_gaps[c].push_back({end, t.offset});
      end = t.offset + t.numel;
    }
    if (end < l.chunk_elems) l.chunk_gaps[c].push_back({end, l.chunk_elems});
  }
}

}  // namespace

Result<Layout> MakeLayout(const ModelDecl& model, uint64_t chunk_bytes, int world) {
  if (world < 1) return InvalidArgumentError("layout: world size must be >= 1");
  STRATA_RETURN_IF_ERROR(ValidateModel(model).WithContext("layout"));
  Layout l;
  l.world = world;
  for (const TensorDecl& t : model.tensors) l.num_params += t.numel();
  // The chunk holds at least the largest module, so that a module's tensors (a weight
  // and its bias) share a chunk: sized to the largest tensor alone, a bias would spill
  // into a chunk of its own and every other chunk would be padding.
  int64_t largest = 0;
  for (const ModuleDecl& m : model.modules) {
    int64_t numel = 0;
    for (TensorId id : m.tensors) numel += model.tensors[id].numel();
    l.module_tensors.push_back(m.tensors);
    l.module_params.push_back(numel);
    largest = std::max(largest, numel);
  }
  const int64_t unit = static_cast<int64_t>(world) * kShardAlignElems;
  // A chunk larger than the whole model would only move padding.
  int64_t want =
      std::max<int64_t>(std::min<int64_t>(static_cast<int64_t>(chunk_bytes / 4), l.num_params), largest);
  l.chunk_elems = (want + unit - 1) / unit * unit;
  l.shard_elems = l.chunk_elems / world;

  l.tensors.resize(model.tensors.size());
  int chunk = 0;
  int64_t used = 0;
  l.chunk_tensors.emplace_back();
  for (TensorId id : PlacementOrder(model)) {
    const int64_t n = model.tensors[id].numel();
    if (used + n > l.chunk_elems) {
      ++chunk;
      used = 0;
      l.chunk_tensors.emplace_back();
    }
    l.tensors[id] = TensorPlace{chunk, used, n};
    l.chunk_tensors[chunk].push_back(id);
    used += n;
  }
  l.num_chunks = chunk + 1;
  for (const ModuleDecl& m : model.modules) {
    std::vector<int> chunks;
    for (TensorId id : m.tensors) chunks.push_back(l.tensors[id].chunk);
    std::sort(chunks.begin(), chunks.end());
    chunks.erase(std::unique(chunks.begin(), chunks.end()), chunks.end());
    l.module_chunks.push_back(std::move(chunks));
  }
  FindGaps(l);
  return l;
}

}  // namespace strata::zero
