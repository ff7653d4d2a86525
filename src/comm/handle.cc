#include "strata/comm.h"

namespace strata {
namespace {

class DoneOp final : public comm_internal::PendingOp {
 public:
  explicit DoneOp(Status s) : status_(std::move(s)) {}
  Status Wait() override { return status_; }
  Result<bool> Test() override {
    if (!status_.ok()) return status_;
    return true;
  }

 private:
  Status status_;
};

}  // namespace

CommHandle CommHandle::Done(Status status) {
  if (status.ok()) return CommHandle();
  return CommHandle(std::make_shared<DoneOp>(std::move(status)));
}

Status CommHandle::Wait() { return op_ ? op_->Wait() : OkStatus(); }

Result<bool> CommHandle::Test() {
  if (!op_) return true;
  return op_->Test();
}

std::string_view CollectiveKindName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllGather: return "AllGather";
    case CollectiveKind::kReduceScatter: return "ReduceScatter";
    case CollectiveKind::kAllReduce: return "AllReduce";
  }
  return "?";
}

}  // namespace strata
