#include "zero/keep_plan.h"

#include <algorithm>
#include <numeric>

namespace strata::zero {

std::vector<int64_t> ReuseDistances(const Layout& l) {
  const int n = static_cast<int>(l.tensors.size());
  // after[m]: parameters of the modules after m.
  std::vector<int64_t> after(n + 1, 0);
  for (int m = n - 1; m >= 0; --m) {
    int64_t numel = 0;
    for (const TensorPlace& t : l.tensors[m]) numel += t.numel;
    after[m] = after[m + 1] + numel;
  }
  std::vector<int64_t> d(l.num_chunks);
  for (int c = 0; c < l.num_chunks; ++c) d[c] = 2 * after[l.chunk_last_module[c] + 1];
  return d;
}

KeepPlan PlanKeep(const Layout& l, uint64_t max_reuse_distance, uint64_t persistence_threshold,
                  int spare_buffers) {
  KeepPlan plan;
  plan.kept.assign(l.num_chunks, 0);
  if (persistence_threshold > 0) {
    std::vector<int64_t> largest(l.num_chunks, 0);
    for (const auto& module : l.tensors) {
      for (const TensorPlace& t : module) largest[t.chunk] = std::max(largest[t.chunk], t.numel);
    }
    for (int c = 0; c < l.num_chunks; ++c) {
      if (static_cast<uint64_t>(largest[c]) < persistence_threshold) {
        plan.kept[c] = 1;
        ++plan.persistent;
      }
    }
  }
  const std::vector<int64_t> distance = ReuseDistances(l);
  std::vector<int> order(l.num_chunks);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return distance[a] != distance[b] ? distance[a] < distance[b] : a > b;
  });
  for (int c : order) {
    if (plan.reused >= spare_buffers) break;
    if (static_cast<uint64_t>(distance[c]) > max_reuse_distance) break;
    if (plan.kept[c]) continue;
    plan.kept[c] = 1;
    ++plan.reused;
  }
  return plan;
}

int PeakGathered(const Layout& l, const std::vector<uint8_t>& kept, int window) {
  const int n = static_cast<int>(l.module_chunks.size());
  auto module_at = [n](int pos) { return pos < n ? pos : 2 * n - 1 - pos; };
  std::vector<uint8_t> in(l.num_chunks, 0), wanted(l.num_chunks, 0);
  int count = 0, peak = 0;
  for (int pos = 0; pos < 2 * n; ++pos) {
    const int last = std::min(pos + window, 2 * n - 1);
    for (int p = pos; p <= last; ++p) {
      for (int c : l.module_chunks[module_at(p)]) {
        if (!in[c]) ++count;
        in[c] = 1;
      }
    }
    peak = std::max(peak, count);
    std::fill(wanted.begin(), wanted.end(), 0);
    for (int p = pos + 1; p <= last; ++p) {
      for (int c : l.module_chunks[module_at(p)]) wanted[c] = 1;
    }
    for (int c = 0; c < l.num_chunks; ++c) {
      const bool keep = wanted[c] || (kept[c] && pos < 2 * n - 1 - l.chunk_first_module[c]);
      if (in[c] && !keep) {
        in[c] = 0;
        --count;
      }
    }
  }
  return peak;
}

}  // namespace strata::zero
