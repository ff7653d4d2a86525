// The order in which a model uses its modules in a micro-batch, as the engine records it.
//
// Why: the stage-3 prefetch window, the chunks kept gathered between uses, and the
// moment a chunk's gradients are final (so its reduction can start during the backward)
// all depend on which module runs next. The engine assumes the plain order (forward
// 0..n-1, backward n-1..0) until it has seen one micro-batch, then follows what it
// recorded: recompute (forward uses inside the backward), frozen modules (no backward),
// modules called twice, tied tensors. When a micro-batch departs from the recording, the
// engine stops acting on it for the rest of that micro-batch (gathers on demand, reduces
// at its end) and records again.
//
// Thread rules: the engine's training thread only (the hooks' caller).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "zero/layout.h"

namespace strata::zero {

// kForward: Fetch (forward or recompute); kBackward: BeginBackward; kGrad: a gradient
// handed in by Engine::AccumulateGrad (code with its own autograd).
enum class UseKind : uint8_t { kForward, kBackward, kGrad };

struct ModuleUse {
  UseKind kind = UseKind::kForward;
  int module = 0;  // kGrad: the tensor id
  bool operator==(const ModuleUse&) const = default;
};

// The chunks a use needs gathered: its module's; none for a gradient handed in.
const std::vector<int>& GatheredChunks(const ModuleUse& use, const Layout& layout);
// Parameters a use reads (0 for a gradient handed in).
int64_t ParamsRead(const ModuleUse& use, const Layout& layout);

class Trace {
 public:
  Trace() = default;
  explicit Trace(std::vector<ModuleUse> uses);
  // Forward 0..n-1, then backward n-1..0.
  static Trace Assumed(int num_modules);

  int size() const { return static_cast<int>(uses_.size()); }
  const ModuleUse& at(int pos) const { return uses_[pos]; }
  const std::vector<ModuleUse>& uses() const { return uses_; }
  // The position of the first backward use or gradient (size() when there is none).
  int forward_end() const { return forward_end_; }

 private:
  std::vector<ModuleUse> uses_;
  int forward_end_ = 0;
};

// "forward of module 3" / "backward of module 3".
std::string DescribeUse(const ModuleUse& use);

// Where each chunk is used along a trace (positions; -1: never).
struct ChunkUses {
  int forward_end = 0;             // Trace::forward_end()
  std::vector<int> backward_uses;  // backward uses and gradients handed in, per micro-batch
  std::vector<int> first_use, last_use;
  std::vector<int> last_forward_use;          // the last one before forward_end
  std::vector<int> first_backward_phase_use;  // the first one at or after forward_end
};
ChunkUses UsesOf(const Trace& trace, const Layout& layout);

// The expected order and the recording of the current micro-batch.
class CallOrder {
 public:
  explicit CallOrder(const Layout& layout);  // expects Trace::Assumed until it records

  // Notes a hook's use of a module; returns its position in the micro-batch.
  int Note(UseKind kind, int module);
  // Whether this micro-batch has left the expected order (from the first use that differs).
  bool diverged() const { return diverged_; }
  // Ends the micro-batch. When its uses differ from the expected order they become the
  // expected order; returns a line for the log saying so (nullopt when nothing changed).
  std::optional<std::string> EndMicroBatch();

  const Trace& trace() const { return expected_; }
  const ChunkUses& uses() const { return uses_; }

 private:
  const Layout* layout_;
  Trace expected_;
  ChunkUses uses_;
  bool recorded_ = false;  // expected_ is a recording, not the assumption
  std::vector<ModuleUse> recording_;
  bool diverged_ = false;
};

}  // namespace strata::zero
