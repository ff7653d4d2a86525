#include "zero/trace.h"

namespace strata::zero {

Trace::Trace(std::vector<ModuleUse> uses)
    : uses_(std::move(uses)), forward_end_(static_cast<int>(uses_.size())) {
  for (int p = 0; p < size(); ++p) {
    if (uses_[p].kind != UseKind::kForward) {
      forward_end_ = p;
      break;
    }
  }
}

Trace Trace::Assumed(int num_modules) {
  std::vector<ModuleUse> uses;
  for (int m = 0; m < num_modules; ++m) uses.push_back({UseKind::kForward, m});
  for (int m = num_modules - 1; m >= 0; --m) uses.push_back({UseKind::kBackward, m});
  return Trace(std::move(uses));
}

std::string DescribeUse(const ModuleUse& use) {
  switch (use.kind) {
    case UseKind::kForward: return "forward of module " + std::to_string(use.module);
    case UseKind::kBackward: return "backward of module " + std::to_string(use.module);
    case UseKind::kGrad: break;
  }
  return "gradient of tensor " + std::to_string(use.module);
}

const std::vector<int>& GatheredChunks(const ModuleUse& use, const Layout& layout) {
  static const std::vector<int> kNone;
  return use.kind == UseKind::kGrad ? kNone : layout.module_chunks[use.module];
}

int64_t ParamsRead(const ModuleUse& use, const Layout& layout) {
  return use.kind == UseKind::kGrad ? 0 : layout.module_params[use.module];
}

ChunkUses UsesOf(const Trace& trace, const Layout& layout) {
  const int chunks = layout.num_chunks;
  ChunkUses u;
  u.forward_end = trace.forward_end();
  u.backward_uses.assign(chunks, 0);
  u.first_use.assign(chunks, -1);
  u.last_use.assign(chunks, -1);
  u.last_forward_use.assign(chunks, -1);
  u.first_backward_phase_use.assign(chunks, -1);
  for (int p = 0; p < trace.size(); ++p) {
    const ModuleUse& use = trace.at(p);
    if (use.kind == UseKind::kGrad) {
      for (int c = layout.FirstChunk(use.module); c <= layout.LastChunk(use.module); ++c)
        ++u.backward_uses[c];
      continue;
    }
    for (int c : layout.module_chunks[use.module]) {
      if (use.kind == UseKind::kBackward) ++u.backward_uses[c];
      if (u.first_use[c] < 0) u.first_use[c] = p;
      u.last_use[c] = p;
      if (p < u.forward_end) u.last_forward_use[c] = p;
      if (p >= u.forward_end && u.first_backward_phase_use[c] < 0) u.first_backward_phase_use[c] = p;
    }
  }
  return u;
}

CallOrder::CallOrder(const Layout& layout)
    : layout_(&layout), expected_(Trace::Assumed(layout.num_modules())), uses_(UsesOf(expected_, layout)) {}

int CallOrder::Note(UseKind kind, int module) {
  const int pos = static_cast<int>(recording_.size());
  const ModuleUse use{kind, module};
  if (pos >= expected_.size() || !(expected_.at(pos) == use)) diverged_ = true;
  recording_.push_back(use);
  return pos;
}

std::optional<std::string> CallOrder::EndMicroBatch() {
  std::vector<ModuleUse> seen = std::move(recording_);
  recording_.clear();
  const bool changed = diverged_ || seen.size() != expected_.uses().size();
  diverged_ = false;
  if (seen.empty() || !changed) {
    recorded_ = recorded_ || !seen.empty();
    return std::nullopt;
  }
  size_t first = 0;
  while (first < seen.size() && first < expected_.uses().size() && seen[first] == expected_.at(first))
    ++first;
  std::string line = std::string(recorded_ ? "call order changed" : "call order differs from the plain one") +
                     " at use " + std::to_string(first) + " (" +
                     (first < expected_.uses().size() ? "expected " + DescribeUse(expected_.at(first))
                                                      : "expected the end") +
                     ", got " + (first < seen.size() ? DescribeUse(seen[first]) : "the end") +
                     "); recorded again: " + std::to_string(seen.size()) + " uses";
  expected_ = Trace(std::move(seen));
  uses_ = UsesOf(expected_, *layout_);
  recorded_ = true;
  return line;
}

}  // namespace strata::zero
