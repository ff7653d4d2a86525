// strata._strata.IoHandle and pinned_bytes: strata's IoEngine (io_uring, or psync where
// the kernel refuses io_uring) for torch tensors, and tensors on pinned host arenas.
//
// An IoHandle keeps every submitted op (its engine handle and the DLPack view that
// keeps the tensor alive) until Wait(). Files are opened (O_DIRECT) and registered with
// the engine on first use and closed when Wait() leaves no op pending. Not thread-safe:
// one Python thread uses a handle at a time, as with DeepNVMe's aio_handle.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "module.h"
#include "ndarray_util.h"
#include "pinned_pool.h"
#include "status_py.h"
#include "strata/io.h"
#include "tiering/io_fault.h"

namespace nb = nanobind;

namespace strata::py {
namespace {

using CpuArray = nb::ndarray<nb::device::cpu>;
// Test-only injected failures: (errno, op: 0 read / 1 write / -1 any, file offset or -1, times).
using FaultRule = std::tuple<int, int, int64_t, int>;

std::string Describe(bool write, uint64_t length, uint64_t offset, const std::string& path) {
  return std::string("strata.io: ") + (write ? "pwrite" : "pread") + " of " + std::to_string(length) +
         " bytes at offset " + std::to_string(offset) + (write ? " to " : " from ") + path;
}

Result<IoBackendKind> ParseBackend(const std::string& name) {
  if (name == "auto") return IoBackendKind::kAuto;
  if (name == "io_uring") return IoBackendKind::kIoUring;
  if (name == "psync") return IoBackendKind::kPsync;
  return InvalidArgumentError("backend must be \"auto\", \"io_uring\" or \"psync\", got \"" + name + "\"");
}

class IoHandlePy {
 public:
  IoHandlePy(uint64_t block_size, int queue_depth, int threads, const std::string& backend,
             const std::vector<FaultRule>& faults) {
    Result<IoBackendKind> kind = ParseBackend(backend);
    if (!kind.ok()) RaiseStatus(kind.status(), "strata.io.aio_handle");
    IoEngineOptions options;
    options.backend = *kind;
    options.block_size = block_size;
    options.queue_depth = queue_depth;
    options.threads = threads;
    if (!faults.empty()) options.fault_hook = MakeFaults(faults);
    Result<std::unique_ptr<IoEngine>> engine = IoEngine::Create(options);
    if (!engine.ok()) RaiseStatus(engine.status(), "strata.io.aio_handle");
    engine_ = std::move(engine).value();
  }

  void Submit(bool write, const CpuArray& buffer, bool torch_pinned, const std::string& path,
              uint64_t offset) {
    const uint64_t nbytes = buffer.nbytes();
    if (nbytes == 0) RaiseValueError(Describe(write, 0, offset, path) + ": the tensor is empty");
    if (!IsContiguous(buffer))
      RaiseValueError(Describe(write, nbytes, offset, path) + ": the tensor is not contiguous");
    const uint64_t length = TransferLength(write, buffer, torch_pinned, path, offset);
    CheckAligned(write, buffer.data(), length, offset, path);
    if (!write) CheckFileSize(length, offset, path);
    const int file = FileId(path, write, length, offset);
    RegisterBuffersIfIdle();
    Result<IoHandle> handle = write ? engine_->Write(file, offset, length, buffer.data())
                                    : engine_->Read(file, offset, length, buffer.data());
    if (!handle.ok()) {
      ReleaseFilesIfIdle();
      RaiseStatus(handle.status(), Describe(write, length, offset, path), path);
    }
    ops_.push_back(Op{*handle, buffer, path, offset, length, write});
  }

  // Waits for every pending op; returns how many completed. The first failure (after
  // all have completed) is raised.
  int Wait() {
    std::vector<Op> ops;
    ops.swap(ops_);
    std::vector<Status> results(ops.size());
    {
      nb::gil_scoped_release release;
      for (size_t i = 0; i < ops.size(); ++i) results[i] = ops[i].handle.Wait();
    }
    ReleaseFilesIfIdle();
    for (size_t i = 0; i < ops.size(); ++i) {
      const Op& op = ops[i];
      if (!results[i].ok())
        RaiseStatus(results[i], Describe(op.write, op.length, op.offset, op.path), op.path);
    }
    return static_cast<int>(ops.size());
  }

  size_t pending() const { return ops_.size(); }
  std::string backend() const { return std::string(engine_->backend_name()); }
  uint64_t block_size() const { return engine_->options().block_size; }
  int queue_depth() const { return engine_->options().queue_depth; }
  int threads() const { return engine_->options().threads; }
  uint64_t alignment() const { return engine_->options().alignment; }
  std::map<std::string, uint64_t> stats() const {
    const IoEngineStats s = engine_->stats();
    return {{"requests", s.requests},
            {"pieces", s.pieces},
            {"submits", s.submits},
            {"short_retries", s.short_retries},
            {"again_retries", s.again_retries},
            {"fixed_pieces", s.fixed_pieces}};
  }

 private:
  struct Op {
    IoHandle handle;
    CpuArray buffer;  // keeps the tensor's memory alive until the op is waited for
    std::string path;
    uint64_t offset;
    uint64_t length;
    bool write;
  };

  static std::shared_ptr<IoFaultHook> MakeFaults(const std::vector<FaultRule>& faults) {
    auto hook = std::make_shared<ScriptedFaults>();
    for (const auto& [error, op, offset, times] : faults) {
      ScriptedFaults::Rule rule;
      rule.error = error;
      rule.op = op;
      rule.offset = offset;
      rule.times = times;
      hook->Add(rule);
    }
    return hook;
  }

  // O_DIRECT needs whole aligned blocks: a tensor on strata's pinned memory may carry
  // its block's padding along; other pinned tensors must be a whole number of blocks.
  uint64_t TransferLength(bool write, const CpuArray& buffer, bool torch_pinned, const std::string& path,
                          uint64_t offset) const {
    const uint64_t nbytes = buffer.nbytes();
    if (auto length = PinnedPool::Get().TransferLength(buffer.data(), nbytes, alignment())) return *length;
    if (!torch_pinned) {
      RaiseValueError(Describe(write, nbytes, offset, path) +
                      ": the tensor is not in pinned memory (O_DIRECT transfers need page-locked, aligned "
                      "buffers): allocate it with strata.io.pinned_empty()");
    }
    return nbytes;
  }

  // The engine checks this too; checking first keeps a refused write from creating the file.
  void CheckAligned(bool write, const void* data, uint64_t length, uint64_t offset,
                    const std::string& path) const {
    const uint64_t a = alignment();
    const auto check = [&](const char* what, uint64_t value) {
      if (value % a != 0) {
        RaiseValueError(Describe(write, length, offset, path) + ": " + what + " " + std::to_string(value) +
                        " is not a multiple of the O_DIRECT alignment " + std::to_string(a));
      }
    };
    check("offset", offset);
    check("buffer address", reinterpret_cast<uintptr_t>(data));
    check("length", length);
  }

  void CheckFileSize(uint64_t length, uint64_t offset, const std::string& path) const {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      const int err = errno;
      RaiseStatus(ErrnoError(err, "stat " + path), Describe(false, length, offset, path), path);
    }
    const auto size = static_cast<uint64_t>(st.st_size);
    if (S_ISREG(st.st_mode) && offset + length > size) {
      const std::string message =
          Describe(false, length, offset, path) + ": the file holds only " + std::to_string(size) + " bytes";
      PyErr_SetString(PyExc_EOFError, message.c_str());
      throw nb::python_error();
    }
  }

  int FileId(const std::string& path, bool write, uint64_t length, uint64_t offset) {
    if (auto it = files_.find(path); it != files_.end()) return it->second;
    Result<int> id = engine_->RegisterFile(path, /*create=*/write);
    if (!id.ok()) RaiseStatus(id.status(), Describe(write, length, offset, path), path);
    files_.emplace(path, *id);
    return *id;
  }

  void ReleaseFilesIfIdle() {
    if (!ops_.empty()) return;
    for (const auto& [path, id] : files_) {
      // Nothing is in flight on an idle handle, the only reason Unregister refuses.
      engine_->UnregisterFile(id).IgnoreError();
    }
    files_.clear();
  }

  // Fixed (registered) buffers spare io_uring pinning pages per transfer. The engine
  // takes them only with nothing in flight; a refusal (memlock) just leaves them off.
  void RegisterBuffersIfIdle() {
    if (!ops_.empty()) return;
    uint64_t generation = 0;
    std::vector<IoBufferRegion> regions = PinnedPool::Get().Regions(&generation);
    if (generation == registered_generation_ || regions.empty()) return;
    engine_->RegisterBuffers(regions).IgnoreError();  // optional speed-up, see above
    registered_generation_ = generation;
  }

  // Destroyed in reverse order: the engine first (it waits for in-flight requests),
  // then the ops' views of the buffers those requests used.
  std::vector<Op> ops_;
  std::map<std::string, int> files_;
  uint64_t registered_generation_ = 0;
  std::unique_ptr<IoEngine> engine_;
};

void FreePinned(void* data) noexcept { PinnedPool::Get().Free(data); }

// A 1-D uint8 torch tensor of `nbytes` on pinned memory, freed when torch frees it.
nb::object PinnedBytes(uint64_t nbytes) {
  Result<void*> data = PinnedPool::Get().Allocate(nbytes);
  if (!data.ok()) RaiseStatus(data.status(), "strata.io.pinned_empty: " + std::to_string(nbytes) + " bytes");
  nb::capsule owner(*data, FreePinned);
  const size_t shape[1] = {static_cast<size_t>(nbytes)};
  return nb::ndarray<nb::pytorch, uint8_t, nb::ndim<1>>(*data, 1, shape, owner).cast();
}

std::map<std::string, uint64_t> PinnedStats() {
  const PinnedPool::Stats s = PinnedPool::Get().stats();
  return {{"arenas", s.arenas},
          {"arena_bytes", s.arena_bytes},
          {"allocated_bytes", s.allocated_bytes},
          {"live_blocks", s.live_blocks}};
}

}  // namespace

void BindIo(nb::module_& m) {
  nb::class_<IoHandlePy>(
      m, "IoHandle", "strata's IoEngine for torch tensors: O_DIRECT reads and writes, queued until wait().")
      .def(nb::init<uint64_t, int, int, const std::string&, const std::vector<FaultRule>&>(),
           nb::arg("block_size"), nb::arg("queue_depth"), nb::arg("threads"), nb::arg("backend"),
           nb::arg("faults"))
      .def("submit", &IoHandlePy::Submit, nb::arg("write"), nb::arg("buffer").noconvert(),
           nb::arg("torch_pinned"), nb::arg("path"), nb::arg("offset"))
      .def("wait", &IoHandlePy::Wait)
      .def_prop_ro("pending", &IoHandlePy::pending)
      .def_prop_ro("backend", &IoHandlePy::backend)
      .def_prop_ro("block_size", &IoHandlePy::block_size)
      .def_prop_ro("queue_depth", &IoHandlePy::queue_depth)
      .def_prop_ro("threads", &IoHandlePy::threads)
      .def_prop_ro("alignment", &IoHandlePy::alignment)
      .def("stats", &IoHandlePy::stats);
  m.def("pinned_bytes", &PinnedBytes, nb::arg("nbytes"),
        "A 1-D uint8 torch tensor of nbytes on strata's pinned host arenas (4 KiB aligned).");
  m.def("pinned_stats", &PinnedStats,
        "Arenas, their bytes, bytes allocated and live blocks of the pinned pool.");
}

}  // namespace strata::py
