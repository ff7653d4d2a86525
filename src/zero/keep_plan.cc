#include "zero/keep_plan.h"

#include <algorithm>
#include <numeric>

namespace strata::zero {
namespace {

// before[m]: parameters of the modules before m (m = 0..L).
std::vector<int64_t> ParamsBefore(const Layout& l) {
  std::vector<int64_t> before(l.tensors.size() + 1, 0);
  for (size_t m = 0; m < l.tensors.size(); ++m) {
    before[m + 1] = before[m];
    for (const TensorPlace& t : l.tensors[m]) before[m + 1] += t.numel;
  }
  return before;
}

}  // namespace

std::vector<int64_t> ReuseDistances(const Layout& l) {
  const std::vector<int64_t> before = ParamsBefore(l);
  std::vector<int64_t> d(l.num_chunks);
  for (int c = 0; c < l.num_chunks; ++c) d[c] = 2 * (before.back() - before[l.chunk_last_module[c] + 1]);
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

std::vector<int64_t> CarryDistances(const Layout& l) {
  const std::vector<int64_t> before = ParamsBefore(l);
  std::vector<int64_t> d(l.num_chunks);
  for (int c = 0; c < l.num_chunks; ++c) d[c] = 2 * before[l.chunk_first_module[c]];
  return d;
}

std::vector<uint8_t> PlanCarry(const Layout& l, uint64_t max_reuse_distance, int count) {
  const std::vector<int64_t> distance = CarryDistances(l);
  std::vector<uint8_t> carried(l.num_chunks, 0);
  for (int c = 0; c < l.num_chunks && c < count; ++c) {
    // Distances grow with the chunk index (modules are packed in order).
    if (static_cast<uint64_t>(distance[c]) > max_reuse_distance) break;
    carried[c] = 1;
  }
  return carried;
}

bool StaysGathered(const Layout& l, const std::vector<uint8_t>& kept, const std::vector<uint8_t>& carried,
                   int c, int pos, bool last_micro_batch) {
  const int n = static_cast<int>(l.module_chunks.size());
  const int last_backward_use = 2 * n - 1 - l.chunk_first_module[c];
  if (!kept.empty() && kept[c] && pos < last_backward_use) return true;
  if (carried.empty() || !carried[c]) return false;
  if (pos < n) return pos < l.chunk_last_module[c];  // brought over: until its forward use
  return pos >= last_backward_use && !last_micro_batch;
}

int PeakGathered(const Layout& l, const std::vector<uint8_t>& kept, int window,
                 const std::vector<uint8_t>& carried, int micro_batches) {
  const int n = static_cast<int>(l.module_chunks.size());
  std::vector<uint8_t> in(l.num_chunks, 0), wanted(l.num_chunks, 0);
  int count = 0, peak = 0;
  const int runs = std::min(micro_batches, 3);
  for (int mb = 0; mb < runs; ++mb) {
    const bool last = mb + 1 == runs;
    for (int pos = 0; pos < 2 * n; ++pos) {
      const int end = std::min(pos + window, 2 * n - 1);
      for (int p = pos; p <= end; ++p) {
        for (int c : l.module_chunks[ModuleAt(p, n)]) {
          if (!in[c]) ++count;
          in[c] = 1;
        }
      }
      peak = std::max(peak, count);
      std::fill(wanted.begin(), wanted.end(), 0);
      for (int p = pos + 1; p <= end; ++p) {
        for (int c : l.module_chunks[ModuleAt(p, n)]) wanted[c] = 1;
      }
      for (int c = 0; c < l.num_chunks; ++c) {
        if (in[c] && !wanted[c] && !StaysGathered(l, kept, carried, c, pos, last)) {
          in[c] = 0;
          --count;
        }
      }
    }
  }
  return peak;
}

}  // namespace strata::zero
