// Engine::SaveCheckpoint: the ranks agree at each phase (so a rank that fails never
// leaves the others waiting in a collective), write their state files into the save's
// temporary directory, and rank 0 writes the manifest and renames the directory into
// place (checkpoint.h).
#include "zero/engine_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <nlohmann/json.hpp>
#include <random>

#include "strata/log.h"
#include "zero/checkpoint_dir.h"

namespace strata::ckpt {

Result<std::vector<uint64_t>> ExchangeWords(Engine::Impl& s, const std::vector<uint64_t>& mine) {
  if (s.world_size == 1) return mine;
  std::vector<uint64_t> all(mine.size() * s.world_size);
  // Moved as bytes (two floats each); nothing is computed on them in transit.
  auto done = s.comm_worker.Submit(
      [&] { return s.world->AllGather(mine.data(), all.data(), 2 * mine.size(), DType::kF32).Wait(); });
  STRATA_RETURN_IF_ERROR(done.get());
  return all;
}

Status AgreeOnStatus(Engine::Impl& s, const Status& local, const std::string& what) {
  if (!local.ok() && s.world_size > 1) {
    STRATA_LOG(kError, "ckpt") << "rank " << s.rank << ": " << what << ": " << local.ToString();
  }
  auto all = ExchangeWords(s, {local.ok() ? 0u : 1u});
  if (!all.ok()) return all.status().WithContext(what);
  if (!local.ok()) return local;
  for (int r = 0; r < s.world_size; ++r) {
    if ((*all)[r] != 0) {
      return AbortedError(what + ": rank " + std::to_string(r) +
                          " failed (its log and its return value say why)");
    }
  }
  return OkStatus();
}

Status CheckCanCheckpoint(Engine::Impl& s, const char* call) {
  STRATA_RETURN_IF_ERROR(s.RefuseAfterFailure());
  if (s.in_micro_batch) {
    return FailedPreconditionError(
        std::string("engine: ") + call +
        " inside a micro-batch; call it after Step(), before the next micro-batch");
  }
  return s.CheckHooksDone();
}

Result<IoEngine*> CheckpointIo(Engine::Impl& s, std::unique_ptr<IoEngine>* own) {
  if (s.io) return s.io.get();
  IoEngineOptions options = IoEngineOptions::FromConfig(s.config);
  options.fault_hook = s.io_fault_hook;
  STRATA_ASSIGN_OR_RETURN(*own, IoEngine::Create(options));
  return own->get();
}

}  // namespace strata::ckpt

namespace strata {
namespace {

using ckpt::kStateKinds;

const char* TierName(ZeroTier t) {
  switch (t) {
    case ZeroTier::kDevice: return "none";
    case ZeroTier::kHost: return "cpu";
    case ZeroTier::kNvme: return "nvme";
  }
  return "none";
}

// Everything of the manifest but the files.
ckpt::Manifest DescribeEngine(Engine::Impl& s, const CheckpointMeta& meta) {
  ckpt::Manifest m;
  CheckpointInfo& i = m.info;
  i.version = ckpt::kFormatVersion;
  i.world_size = s.world_size;
  i.stage = s.stage;
  i.state_ranks = s.stage == 0 ? 1 : s.world_size;
  i.compute_dtype = std::string(DTypeName(s.compute));
  i.offload_optimizer = TierName(s.opt_tier);
  i.offload_param = s.stage == 3 ? TierName(s.param_tier) : "none";
  i.num_params = s.layout.num_params;
  i.num_tensors = static_cast<int64_t>(s.layout.tensors.size());
  i.num_chunks = s.layout.num_chunks;
  i.chunk_elems = s.layout.chunk_elems;
  i.shard_elems = s.opt_elems;
  i.chunk_bytes = ckpt::ChunkBytes(s);
  i.step_calls = s.resumed_step_calls + s.step_epoch;
  i.optimizer_steps = s.step_count;
  i.loss_scale = s.scaler->scale();
  i.lr = s.adam.lr;
  i.meta_json = meta.json;
  for (size_t t = 0; t < s.layout.tensors.size(); ++t) {
    const zero::TensorPlace& p = s.layout.tensors[t];
    m.tensors.push_back({s.model.tensors[t].name, s.model.tensors[t].shape, p.chunk, p.offset, p.numel});
  }
  m.scaler = s.scaler->state();
  m.scaler_dynamic = s.scaler->dynamic();
  for (const zero::ModuleUse& u : s.order->trace().uses())
    m.call_order.emplace_back(static_cast<int>(u.kind), u.module);
  m.config_json = ConfigToJson(s.config).dump();
  return m;
}

// This rank's part of the gathered file records: failed flag, then per kind its size,
// checksum and chunk checksums (zeros from a rank that writes no files).
std::vector<uint64_t> FileWords(const Status& written, const std::vector<CheckpointFileInfo>& files,
                                int chunks) {
  std::vector<uint64_t> w(1 + kStateKinds * (2 + chunks), 0);
  w[0] = written.ok() ? 0 : 1;
  for (size_t k = 0; written.ok() && k < files.size(); ++k) {
    uint64_t* at = w.data() + 1 + k * (2 + chunks);
    at[0] = files[k].bytes;
    at[1] = files[k].xxh3;
    std::copy(files[k].chunk_xxh3.begin(), files[k].chunk_xxh3.end(), at + 2);
  }
  return w;
}

void AddFileRecords(ckpt::Manifest& m, const std::vector<uint64_t>& all, size_t words_per_rank) {
  const int chunks = m.info.num_chunks;
  for (int r = 0; r < m.info.state_ranks; ++r) {
    for (int k = 0; k < kStateKinds; ++k) {
      const uint64_t* at = all.data() + r * words_per_rank + 1 + k * (2 + chunks);
      m.info.files.push_back({ckpt::StateFileName(k, r), r, ckpt::kKindNames[k], at[0], at[1],
                              std::vector<uint64_t>(at + 2, at + 2 + chunks)});
    }
  }
}

Status WriteDurably(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(errno, "checkpoint: creating " + path);
  Status st;
  for (size_t done = 0; st.ok() && done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) st = ErrnoError(errno, "checkpoint: writing " + path);
    if (n > 0) done += n;
  }
  if (st.ok() && ::fsync(fd) != 0) st = ErrnoError(errno, "checkpoint: fsync " + path);
  ::close(fd);
  return st;
}

uint64_t RandomNonce() {
  std::random_device rd;
  return static_cast<uint64_t>(rd()) << 32 | rd();
}

std::shared_future<Status> Ready(Status st) {
  std::promise<Status> p;
  p.set_value(std::move(st));
  return p.get_future().share();
}

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// This rank's files of the save, written by save_worker from a snapshot of where the
// state is (the gate holds its blocks until they are read).
std::shared_future<Status> StartWriting(Engine::Impl& s, const std::shared_ptr<ckpt::PendingSave>& p) {
  if (s.rank >= (s.stage == 0 ? 1 : s.world_size)) return Ready(OkStatus());  // stage 0: rank 0 writes
  auto io = ckpt::CheckpointIo(s, &p->own_io);
  if (!io.ok()) return Ready(io.status());
  auto snap = std::make_shared<ckpt::StateSnapshot>(ckpt::Snapshot(s));
  s.save_gate.Hold(ckpt::GateKeys(*snap));
  IoEngine* engine_io = *io;
  HostArena* arena = s.arena;
  zero::SaveGate* gate = &s.save_gate;
  std::shared_future<Status> written = s.save_worker.Submit([snap, engine_io, arena, gate, p] {
    return ckpt::WriteStateFiles(*snap, *engine_io, arena, p->tmp, *gate, &p->files);
  });
  // State on the device is read by the device ops, which the training thread uses too:
  // it is written out before training goes on.
  if (snap->on_device) written.wait();
  return written;
}

}  // namespace

Status Engine::StartCheckpoint(const std::string& dir_arg, const CheckpointMeta& meta) {
  Impl& s = *impl_;
  // Every rank makes the same calls, so the one in flight finishes everywhere here.
  if (s.pending_save) STRATA_RETURN_IF_ERROR(FinishCheckpoint().status());
  s.window_disturbed = true;  // the save is no part of a step's time
  const auto start = std::chrono::steady_clock::now();
  const std::string dir = ckpt::TrimDir(dir_arg);
  const std::string what = "SaveCheckpoint(" + dir + ")";
  Status local = ckpt::CheckCanCheckpoint(s, "SaveCheckpoint");
  if (local.ok() && dir.empty()) local = InvalidArgumentError("SaveCheckpoint: empty directory name");
  if (local.ok()) local = ckpt::CheckJson(meta.json, "SaveCheckpoint: CheckpointMeta::json");
  if (local.ok()) local = Flush();
  // Rank 0's nonce names the temporary directory everywhere.
  STRATA_ASSIGN_OR_RETURN(auto agreed, ckpt::ExchangeWords(s, {local.ok() ? 0u : 1u, RandomNonce()}));
  for (int r = 0; local.ok() && r < s.world_size; ++r) {
    if (agreed[2 * r] != 0) local = AbortedError(what + ": rank " + std::to_string(r) + " cannot save now");
  }
  STRATA_RETURN_IF_ERROR(local);
  auto p = std::make_shared<ckpt::PendingSave>();
  p->dir = dir;
  p->tmp = ckpt::TmpDirFor(dir, agreed[1]);
  p->what = what;
  p->start = start;
  Status st = s.rank == 0 ? ckpt::PrepareSaveDir(dir, p->tmp) : OkStatus();
  STRATA_RETURN_IF_ERROR(ckpt::AgreeOnStatus(s, st, what + ": creating " + p->tmp));
  p->manifest = DescribeEngine(s, meta);  // the scalars of the step saved
  p->written = StartWriting(s, p);
  p->started_s = SecondsSince(start);
  s.pending_save = std::move(p);
  return OkStatus();
}

Result<CheckpointTimes> Engine::FinishCheckpoint() {
  Impl& s = *impl_;
  if (!s.pending_save) {
    return FailedPreconditionError("engine: FinishCheckpoint without a save in progress (StartCheckpoint)");
  }
  if (s.in_micro_batch) {
    return FailedPreconditionError("engine: FinishCheckpoint inside a micro-batch; call it after Step()");
  }
  std::shared_ptr<ckpt::PendingSave> p = std::move(s.pending_save);
  s.pending_save.reset();
  s.window_disturbed = true;  // the files were written during this window
  const auto wait_start = std::chrono::steady_clock::now();
  const Status written = p->written.get();
  CheckpointTimes times;
  times.started_s = p->started_s;
  times.finish_wait_s = SecondsSince(wait_start);
  times.optimizer_wait_s = s.save_gate.TakeWaited() * 1e-9;
  if (!written.ok() && s.world_size > 1) STRATA_LOG(kError, "ckpt") << p->what << ": " << written.ToString();
  const std::vector<uint64_t> mine = FileWords(written, p->files, s.layout.num_chunks);
  auto all = ckpt::ExchangeWords(s, mine);
  Status st = all.ok() ? written : all.status();
  for (int r = 0; st.ok() && r < s.world_size; ++r) {
    if ((*all)[r * mine.size()] != 0)
      st = AbortedError(p->what + ": rank " + std::to_string(r) +
                        " failed writing its files (its log says why)");
  }
  if (st.ok() && s.rank == 0) {
    AddFileRecords(p->manifest, *all, mine.size());
    st = WriteDurably(p->tmp + "/" + ckpt::kManifestName, ckpt::ManifestJson(p->manifest));
    if (st.ok()) st = ckpt::CommitSaveDir(p->tmp, p->dir);
  }
  st = ckpt::AgreeOnStatus(s, st, p->what);
  if (!st.ok()) {
    if (s.rank == 0) ckpt::RemoveTree(p->tmp);
    return st;
  }
  times.total_s = SecondsSince(p->start);
  if (s.rank == 0) {
    STRATA_LOG(kInfo, "ckpt") << "saved " << p->dir << " (step " << p->manifest.info.step_calls << ") in "
                              << times.total_s << " s; training waited " << times.stalled_s() << " s";
  }
  return times;
}

Status Engine::SaveCheckpoint(const std::string& dir, const CheckpointMeta& meta) {
  STRATA_RETURN_IF_ERROR(StartCheckpoint(dir, meta));
  return FinishCheckpoint().status();
}

bool Engine::checkpoint_in_progress() const { return impl_->pending_save != nullptr; }

}  // namespace strata
