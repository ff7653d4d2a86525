#include "tools/mirror_world.h"

#include <cstdlib>
#include <cstring>

namespace strata::tools {
namespace {

class MirrorWorld final : public Communicator {
 public:
  explicit MirrorWorld(int size) : size_(size) {}

  int rank() const override { return 0; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "mirror"; }
  MemorySpace memory_space() const override { return MemorySpace::kHost; }
  const std::string& name() const override { return name_; }

  CommHandle AllGather(const void* send, void* recv, size_t count, DType dtype) override {
    const size_t bytes = count * DTypeSize(dtype);
    for (int r = 0; r < size_; ++r) std::memmove(static_cast<char*>(recv) + r * bytes, send, bytes);
    return CommHandle();
  }
  CommHandle ReduceScatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    return Reduce(send, recv, count, dtype, op);  // this rank's block is the first
  }
  CommHandle AllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    return Reduce(send, recv, count, dtype, op);
  }
  CommHandle Broadcast(void*, size_t, DType, int) override { return CommHandle(); }
  CommHandle Barrier() override { return CommHandle(); }
  Result<std::unique_ptr<Communicator>> Split(int, int) override {
    return UnimplementedError("the mirror world of a plan cannot be split");
  }
  Result<void*> AllocateBuffer(size_t bytes) override {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (p == nullptr) return ResourceExhaustedError("mirror world: out of memory");
    return p;
  }
  void FreeBuffer(void* p) override { std::free(p); }
  Status CopyBuffer(void* dst, const void* src, size_t bytes) override {
    std::memmove(dst, src, bytes);
    return OkStatus();
  }

 private:
  CommHandle Reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) {
    if (dtype != DType::kF32) {
      return CommHandle::Done(UnimplementedError("the mirror world reduces fp32 only"));
    }
    const float scale = op == ReduceOp::kSum ? static_cast<float>(size_) : 1.0f;
    const float* in = static_cast<const float*>(send);
    float* out = static_cast<float*>(recv);
    for (size_t i = 0; i < count; ++i) out[i] = in[i] * scale;
    return CommHandle();
  }

  int size_;
  std::string name_ = "mirror";
};

}  // namespace

Result<std::unique_ptr<Communicator>> CreateMirrorWorld(int size) {
  if (size < 1)
    return InvalidArgumentError("a plan's world size must be at least 1, got " + std::to_string(size));
  return std::unique_ptr<Communicator>(new MirrorWorld(size));
}

}  // namespace strata::tools
