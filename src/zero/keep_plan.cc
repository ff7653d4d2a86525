#include "zero/keep_plan.h"

#include <algorithm>
#include <limits>
#include <numeric>

namespace strata::zero {
namespace {

constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

// Parameters the modules at trace positions (from, to) read, both ends excluded.
int64_t ParamsBetween(const Layout& l, const Trace& trace, int from, int to) {
  int64_t n = 0;
  for (int p = from + 1; p < to; ++p) n += ParamsRead(trace.at(p), l);
  return n;
}

}  // namespace

std::vector<int64_t> ReuseDistances(const Layout& l, const Trace& trace) {
  const ChunkUses u = UsesOf(trace, l);
  std::vector<int64_t> d(l.num_chunks, kNever);
  for (int c = 0; c < l.num_chunks; ++c) {
    const int from = u.last_forward_use[c], to = u.first_backward_phase_use[c];
    if (from >= 0 && to >= 0) d[c] = ParamsBetween(l, trace, from, to);
  }
  return d;
}

KeepPlan PlanKeep(const Layout& l, const Trace& trace, uint64_t max_reuse_distance,
                  uint64_t persistence_threshold, int spare_buffers) {
  KeepPlan plan;
  plan.kept.assign(l.num_chunks, 0);
  if (persistence_threshold > 0) {
    std::vector<int64_t> largest(l.num_chunks, 0);
    for (TensorId id = 0; id < static_cast<TensorId>(l.tensors.size()); ++id)
      for (int c = l.FirstChunk(id); c <= l.LastChunk(id); ++c)
        largest[c] = std::max(largest[c], l.tensors[id].numel);
    for (int c = 0; c < l.num_chunks; ++c) {
      if (static_cast<uint64_t>(largest[c]) < persistence_threshold) {
        plan.kept[c] = 1;
        ++plan.persistent;
      }
    }
  }
  const std::vector<int64_t> distance = ReuseDistances(l, trace);
  std::vector<int> order(l.num_chunks);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return distance[a] != distance[b] ? distance[a] < distance[b] : a > b;
  });
  for (int c : order) {
    if (plan.reused >= spare_buffers) break;
    if (distance[c] == kNever || static_cast<uint64_t>(distance[c]) > max_reuse_distance) break;
    if (plan.kept[c]) continue;
    plan.kept[c] = 1;
    ++plan.reused;
  }
  return plan;
}

std::vector<int64_t> CarryDistances(const Layout& l, const Trace& trace) {
  const ChunkUses u = UsesOf(trace, l);
  std::vector<int64_t> d(l.num_chunks, kNever);
  for (int c = 0; c < l.num_chunks; ++c) {
    if (u.first_use[c] < 0) continue;
    d[c] = ParamsBetween(l, trace, u.last_use[c], trace.size()) + ParamsBetween(l, trace, -1, u.first_use[c]);
  }
  return d;
}

std::vector<uint8_t> PlanCarry(const Layout& l, const Trace& trace, uint64_t max_reuse_distance, int count) {
  const std::vector<int64_t> distance = CarryDistances(l, trace);
  std::vector<int> order(l.num_chunks);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return distance[a] < distance[b]; });
  std::vector<uint8_t> carried(l.num_chunks, 0);
  for (int i = 0; i < l.num_chunks && i < count; ++i) {
    const int c = order[i];
    if (distance[c] == kNever || static_cast<uint64_t>(distance[c]) > max_reuse_distance) break;
    carried[c] = 1;
  }
  return carried;
}

bool StaysGathered(const ChunkUses& u, const std::vector<uint8_t>& kept, const std::vector<uint8_t>& carried,
                   int c, int pos, bool last_micro_batch) {
  if (!kept.empty() && kept[c] && pos < u.last_use[c]) return true;
  if (carried.empty() || !carried[c]) return false;
  if (pos < u.forward_end) return pos < u.last_forward_use[c];  // brought over: until its use there
  return pos >= u.last_use[c] && !last_micro_batch;
}

int PeakGathered(const Layout& l, const Trace& trace, const std::vector<uint8_t>& kept, int window,
                 const std::vector<uint8_t>& carried, int micro_batches) {
  const ChunkUses u = UsesOf(trace, l);
  const int n = trace.size();
  std::vector<uint8_t> in(l.num_chunks, 0), wanted(l.num_chunks, 0);
  int count = 0, peak = 0;
  const int runs = std::min(micro_batches, 3);
  for (int mb = 0; mb < runs; ++mb) {
    const bool last = mb + 1 == runs;
    for (int pos = 0; pos < n; ++pos) {
      const int end = std::min(pos + window, n - 1);
      for (int p = pos; p <= end; ++p) {
        for (int c : GatheredChunks(trace.at(p), l)) {
          if (!in[c] && !l.InRun(c)) ++count;  // a run's chunks have a buffer of their own
          in[c] = 1;
        }
      }
      peak = std::max(peak, count);
      std::fill(wanted.begin(), wanted.end(), 0);
      for (int p = pos + 1; p <= end; ++p) {
        for (int c : GatheredChunks(trace.at(p), l)) wanted[c] = 1;
      }
      for (int c = 0; c < l.num_chunks; ++c) {
        if (in[c] && !wanted[c] && !StaysGathered(u, kept, carried, c, pos, last)) {
          in[c] = 0;
          if (!l.InRun(c)) --count;
        }
      }
    }
  }
  return peak;
}

}  // namespace strata::zero
