#include "zero/param_gatherer.h"

#include <algorithm>
#include <string>
#include <utility>

#include "strata/log.h"
#include "zero/keep_plan.h"
#include "zero/prefetch_depth.h"

namespace strata::zero {

int GatherPlan::kept_count() const { return static_cast<int>(std::count(kept.begin(), kept.end(), 1)); }
int GatherPlan::carried_count() const {
  return static_cast<int>(std::count(carried.begin(), carried.end(), 1));
}

ParamGatherer::ParamGatherer(const Layout& layout, const CallOrder& order, StartFn start)
    : layout_(layout), order_(order), start_(std::move(start)) {}

void ParamGatherer::Configure(const GatherPlan& plan, std::vector<void*> buffers,
                              std::vector<void*> run_places) {
  plan_ = plan;
  free_ = std::move(buffers);
  run_places_ = std::move(run_places);
  prefetch_modules_ = plan.max_prefetch_modules;  // until a step has measured (MeasuredPrefetch)
}

void* ParamGatherer::Params(int chunk) const {
  auto it = gathered_.find(chunk);
  STRATA_CHECK_MSG(it != gathered_.end(), "chunk used before it was gathered");
  return it->second.buf;
}

void ParamGatherer::Start(int chunk) {
  Gathered g;
  if (InRun(chunk)) {
    g.buf = run_places_[chunk];
  } else {
    g.buf = free_.back();
    free_.pop_back();
  }
  g.ready = start_(chunk, g.buf);
  gathered_[chunk] = std::move(g);
}

Status ParamGatherer::FreeUnused(int chunk) {
  // The oldest prefetch that no module uses now gives its buffer back.
  for (auto it = gathered_.begin(); it != gathered_.end(); ++it) {
    if (it->second.users > 0 || InRun(it->first)) continue;  // a run's frees no buffer
    if (evictions_++ == 0) {
      STRATA_LOG(kWarn, "engine") << "no planned gather buffer free for chunk " << chunk << "; chunk "
                                  << it->first
                                  << " released early (the buffer plan missed a case; correct, but gathered "
                                  << "again later)";
    }
    STRATA_RETURN_IF_ERROR(it->second.ready.get());
    Free(it->first, it->second.buf);
    gathered_.erase(it);
    return OkStatus();
  }
  return OutOfBudgetError("engine: no free gather buffer for chunk " + std::to_string(chunk) + " (" +
                          std::to_string(plan_.buffers) +
                          " buffers, all in use); raise strata.device_budget");
}

Status ParamGatherer::EnsureGathered(int chunk) {
  if (!gathered_.count(chunk)) {
    if (!InRun(chunk) && free_.empty()) STRATA_RETURN_IF_ERROR(FreeUnused(chunk));
    Start(chunk);
  }
  Gathered& g = gathered_[chunk];
  STRATA_RETURN_IF_ERROR(g.ready.get());
  ++g.users;
  return OkStatus();
}

void ParamGatherer::Prefetch(int pos) {
  if (order_.diverged() || pos < 0) return;  // off the recording, or an evaluation pass
  const Trace& trace = order_.trace();
  for (int p = pos + 1; p <= pos + prefetch_modules_ && p < trace.size(); ++p) {
    for (int c : GatheredChunks(trace.at(p), layout_)) {
      if (gathered_.count(c)) continue;
      if (!InRun(c) && free_.empty()) return;  // in trace order: nothing later jumps the queue
      Start(c);
    }
  }
}

Status ParamGatherer::Enter(int module, int pos) {
  for (int c : layout_.module_chunks[module]) STRATA_RETURN_IF_ERROR(EnsureGathered(c));
  Prefetch(pos);
  return OkStatus();
}

void ParamGatherer::Leave(int module, int pos, bool last_micro_batch) {
  for (int c : layout_.module_chunks[module]) --gathered_[c].users;
  const bool follows = !order_.diverged() && pos >= 0;
  const Trace& trace = order_.trace();
  std::vector<int> window;
  for (int p = pos + 1; follows && p <= pos + prefetch_modules_ && p < trace.size(); ++p) {
    const auto& chunks = GatheredChunks(trace.at(p), layout_);
    window.insert(window.end(), chunks.begin(), chunks.end());
  }
  for (auto it = gathered_.begin(); it != gathered_.end();) {
    const bool needed = std::find(window.begin(), window.end(), it->first) != window.end() ||
                        (follows && StaysGathered(order_.uses(), plan_.kept, plan_.carried, it->first, pos,
                                                  last_micro_batch));
    if (it->second.users > 0 || needed) {
      ++it;
      continue;
    }
    // A chunk still in flight is waited for: releasing must not depend on timing.
    Status st = it->second.ready.get();
    if (!st.ok())
      STRATA_LOG(kError, "engine") << "gather of chunk " << it->first << " failed: " << st.ToString();
    Free(it->first, it->second.buf);
    it = gathered_.erase(it);
  }
}

Status ParamGatherer::CheckNoneHeld() const {
  for (const auto& [chunk, g] : gathered_) {
    if (g.users > 0) {
      return FailedPreconditionError("engine: Step() while module hooks hold chunk " + std::to_string(chunk) +
                                     " (call it after Release / EndBackward of every module)");
    }
  }
  return OkStatus();
}

Status ParamGatherer::DropAll() {
  STRATA_RETURN_IF_ERROR(CheckNoneHeld());
  Status first;
  for (auto& [chunk, g] : gathered_) {
    Status st = g.ready.get();  // the buffer is free only once its gather is done
    if (first.ok() && !st.ok()) first = st;
    Free(chunk, g.buf);
  }
  gathered_.clear();
  return first;
}

void ParamGatherer::DropUnheld() {
  for (auto it = gathered_.begin(); it != gathered_.end();) {
    (void)it->second.ready.get();  // the buffer is free only once its gather is done
    if (it->second.users > 0) {
      ++it;  // a module still runs on it
      continue;
    }
    Free(it->first, it->second.buf);
    it = gathered_.erase(it);
  }
}

void ParamGatherer::NoteGatherLatency(int64_t ns) {
  gather_latency_ns_ += ns;
  ++gathers_timed_;
}

void ParamGatherer::NoteModuleCompute(int64_t ns) {
  module_compute_ns_ += ns;
  ++modules_timed_;
}

int ParamGatherer::MeasuredPrefetch() {
  const int gathers = gathers_timed_.exchange(0);
  const int64_t latency = gather_latency_ns_.exchange(0);
  int depth = prefetch_modules_;
  if (plan_.max_prefetch_modules > 0 && gathers > 0 && modules_timed_ > 0) {
    depth = PrefetchDepth(latency * 1e-9 / gathers, module_compute_ns_ * 1e-9 / modules_timed_,
                          plan_.max_prefetch_modules);
    STRATA_LOG(kDebug, "engine") << "measured prefetch depth " << depth << " modules (gather "
                                 << latency / 1e6 / gathers << " ms, module compute "
                                 << module_compute_ns_ / 1e6 / modules_timed_ << " ms)";
  }
  module_compute_ns_ = 0;
  modules_timed_ = 0;
  return depth;
}

}  // namespace strata::zero
