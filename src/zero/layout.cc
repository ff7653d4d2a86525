#include "zero/layout.h"

#include <algorithm>

namespace strata::zero {

Result<Layout> MakeLayout(const std::vector<model::ModuleSpec>& modules, uint64_t chunk_bytes, int world) {
  if (world < 1) return InvalidArgumentError("layout: world size must be >= 1");
  if (modules.empty()) return InvalidArgumentError("layout: the model registered no modules");
  Layout l;
  l.world = world;
  // The chunk holds at least the largest module, so that a module's tensors (a weight
  // and its bias) share a chunk: sized to the largest tensor alone, a bias would spill
  // into a chunk of its own and every other chunk would be padding.
  int64_t largest = 0;
  for (const auto& m : modules) {
    if (m.tensors.empty()) {
      return InvalidArgumentError("layout: module \"" + m.name + "\" has no tensors");
    }
    int64_t module_numel = 0;
    for (const auto& t : m.tensors) {
      if (t.numel() <= 0) {
        return InvalidArgumentError("layout: tensor \"" + t.name + "\" has no elements");
      }
      module_numel += t.numel();
      l.num_params += t.numel();
    }
    largest = std::max(largest, module_numel);
  }
  const int64_t unit = static_cast<int64_t>(world) * kShardAlignElems;
  // A chunk larger than the whole model would only move padding.
  int64_t want = std::max<int64_t>(std::min<int64_t>(static_cast<int64_t>(chunk_bytes / 4), l.num_params), largest);
  l.chunk_elems = (want + unit - 1) / unit * unit;
  l.shard_elems = l.chunk_elems / world;

  int chunk = 0;
  int64_t used = 0;
  l.tensors.resize(modules.size());
  l.module_chunks.resize(modules.size());
  for (size_t mi = 0; mi < modules.size(); ++mi) {
    for (size_t ti = 0; ti < modules[mi].tensors.size(); ++ti) {
      int64_t n = modules[mi].tensors[ti].numel();
      if (used + n > l.chunk_elems) {
        ++chunk;
        used = 0;
      }
      l.tensors[mi].push_back(TensorPlace{static_cast<int>(mi), static_cast<int>(ti), chunk, used, n});
      auto& mc = l.module_chunks[mi];
      if (mc.empty() || mc.back() != chunk) mc.push_back(chunk);
      used += n;
    }
  }
  l.num_chunks = chunk + 1;
  l.chunk_first_module.assign(l.num_chunks, -1);
  l.chunk_last_module.assign(l.num_chunks, -1);
  for (size_t mi = 0; mi < modules.size(); ++mi) {
    for (int c : l.module_chunks[mi]) {
      if (l.chunk_first_module[c] < 0) l.chunk_first_module[c] = static_cast<int>(mi);
      l.chunk_last_module[c] = static_cast<int>(mi);
    }
  }
  l.chunk_module_count.assign(l.num_chunks, 0);
  for (const auto& mc : l.module_chunks) {
    for (int c : mc) ++l.chunk_module_count[c];
  }
  l.chunk_gaps.resize(l.num_chunks);
  std::vector<int64_t> end_of(l.num_chunks, 0);
  for (const auto& mod : l.tensors) {
    for (const auto& t : mod) {
      if (t.offset > end_of[t.chunk]) l.chunk_gaps[t.chunk].push_back({end_of[t.chunk], t.offset});
      end_of[t.chunk] = t.offset + t.numel;
    }
  }
  for (int c = 0; c < l.num_chunks; ++c) {
    if (end_of[c] < l.chunk_elems) l.chunk_gaps[c].push_back({end_of[c], l.chunk_elems});
  }
  return l;
}

}  // namespace strata::zero
