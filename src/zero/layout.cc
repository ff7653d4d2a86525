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
      const int64_t start = std::max<int64_t>(0, l.StartIn(id, c));
      if (start > end) l.chunk_gaps[c].push_back({end, start});
      end = std::min(l.chunk_elems, l.StartIn(id, c) + l.tensors[id].numel);
    }
    if (end < l.chunk_elems) l.chunk_gaps[c].push_back({end, l.chunk_elems});
  }
}

// The largest module that is not an outlier: more than kOutlierFactor times the (lower)
// median module. Raised to such a module, a weight and its bias share a chunk: sized to
// the largest tensor alone, a bias would spill into a chunk of its own and every other
// chunk would be padding. An outlier (an embedding of a large vocabulary) would make
// every chunk its size; its tensors take runs instead.
int64_t LargestOrdinaryModule(const std::vector<int64_t>& module_params) {
  std::vector<int64_t> sizes;
  for (int64_t n : module_params)
    if (n > 0) sizes.push_back(n);
  if (sizes.empty()) return 0;
  std::sort(sizes.begin(), sizes.end());
  const int64_t limit = kOutlierFactor * sizes[(sizes.size() - 1) / 2];
  int64_t largest = 0, outliers = 0;
  for (int64_t n : sizes) {
    if (n <= limit)
      largest = n;
    else
      ++outliers;
  }
  // Many large modules are the model's shape, not outliers (an MLP whose small ends
  // are the median): they set the chunk as before.
  return outliers * 4 > static_cast<int64_t>(sizes.size()) ? sizes.back() : largest;
}

// Places the tensors in order: each in the current chunk when it fits, else from the
// next one; one larger than a chunk from a chunk's start, over as many as it needs.
void PlaceTensors(const ModelDecl& model, Layout& l) {
  const int64_t ce = l.chunk_elems;
  l.tensors.resize(model.tensors.size());
  int chunk = 0;
  int64_t used = 0;
  l.chunk_tensors.assign(1, {});
  l.run_first.assign(1, -1);
  l.run_length.assign(1, 1);
  auto next_chunk = [&] {
    ++chunk;
    used = 0;
    l.chunk_tensors.emplace_back();
    l.run_first.push_back(-1);
    l.run_length.push_back(1);
  };
  for (TensorId id : PlacementOrder(model)) {
    const int64_t n = model.tensors[id].numel();
    if (n > ce) {
      if (used > 0) next_chunk();
      const int first = chunk, count = static_cast<int>((n + ce - 1) / ce);
      for (int k = 0; k < count; ++k) {
        if (k > 0) next_chunk();
        l.chunk_tensors[chunk].push_back(id);
        l.run_first[chunk] = first;
        l.run_length[chunk] = count;
      }
      l.tensors[id] = TensorPlace{first, 0, n};
      used = n - static_cast<int64_t>(count - 1) * ce;
      continue;
    }
    if (used + n > ce) next_chunk();
    l.tensors[id] = TensorPlace{chunk, used, n};
    l.chunk_tensors[chunk].push_back(id);
    used += n;
  }
  l.num_chunks = chunk + 1;
}

}  // namespace

Result<Layout> MakeLayout(const ModelDecl& model, uint64_t chunk_bytes, int world) {
  if (world < 1) return InvalidArgumentError("layout: world size must be >= 1");
  STRATA_RETURN_IF_ERROR(ValidateModel(model).WithContext("layout"));
  Layout l;
  l.world = world;
  for (const TensorDecl& t : model.tensors) l.num_params += t.numel();
  for (const ModuleDecl& m : model.modules) {
    int64_t numel = 0;
    for (TensorId id : m.tensors) numel += model.tensors[id].numel();
    l.module_tensors.push_back(m.tensors);
    l.module_params.push_back(numel);
  }
  const int64_t unit = static_cast<int64_t>(world) * kShardAlignElems;
  // A chunk larger than the whole model would only move padding.
  int64_t want = std::max<int64_t>(std::min<int64_t>(static_cast<int64_t>(chunk_bytes / 4), l.num_params),
                                   LargestOrdinaryModule(l.module_params));
  l.chunk_elems = std::max<int64_t>(1, (want + unit - 1) / unit) * unit;
  l.shard_elems = l.chunk_elems / world;
  PlaceTensors(model, l);
  for (const ModuleDecl& m : model.modules) {
    std::vector<int> chunks;
    for (TensorId id : m.tensors)
      for (int c = l.FirstChunk(id); c <= l.LastChunk(id); ++c) chunks.push_back(c);
    std::sort(chunks.begin(), chunks.end());
    chunks.erase(std::unique(chunks.begin(), chunks.end()), chunks.end());
    l.module_chunks.push_back(std::move(chunks));
  }
  FindGaps(l);
  return l;
}

}  // namespace strata::zero
