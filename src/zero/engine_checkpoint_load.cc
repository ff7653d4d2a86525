// Engine::LoadCheckpoint: every rank reads the manifest and checks it against its engine
// and opens its state files before anything changes (the ranks agree on that), then
// streams the state into its tiers (from its own files, or from every saving rank's when
// the checkpoint was laid out otherwise: checkpoint_reshard.h), restores the scalars and
// republishes the compute parameters from the restored master (the compute copy is the
// master rounded, as after every step), so the next Step() is the saving run's.
#include <chrono>

#include "strata/log.h"
#include "zero/checkpoint_dir.h"
#include "zero/engine_checkpoint.h"

namespace strata {
namespace {

std::string Shape(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// InvalidArgument naming the first thing of the checkpoint that this engine cannot take:
// another model. Another world size, sharding or chunk size is resharded (SameLayout).
Status CheckFits(const Engine::Impl& s, const ckpt::Manifest& m, const std::string& dir) {
  const std::string head = "checkpoint " + dir + " does not fit this engine: ";
  if (m.tensors.size() != s.layout.tensors.size()) {
    return InvalidArgumentError(head + "it holds " + std::to_string(m.tensors.size()) +
                                " tensors, this engine's model declares " +
                                std::to_string(s.layout.tensors.size()));
  }
  for (size_t t = 0; t < m.tensors.size(); ++t) {
    const ckpt::TensorEntry& e = m.tensors[t];
    const TensorDecl& d = s.model.tensors[t];
    if (e.name != d.name || e.shape != d.shape) {
      return InvalidArgumentError(head + "tensor " + std::to_string(t) + " is \"" + e.name + "\" " +
                                  Shape(e.shape) + " there, \"" + d.name + "\" " + Shape(d.shape) + " here");
    }
  }
  for (const auto& [kind, module] : m.call_order) {
    const bool grad = kind == static_cast<int>(zero::UseKind::kGrad);
    const int limit = grad ? static_cast<int>(s.layout.tensors.size()) : s.layout.num_modules();
    if (kind < 0 || kind > static_cast<int>(zero::UseKind::kGrad) || module < 0 || module >= limit) {
      return CorruptionError("checkpoint " + dir +
                             ": its recorded call order names a module or tensor this "
                             "model does not have");
    }
  }
  return OkStatus();
}

// Whether each rank's files hold its own shards as this engine lays them out: the same
// ranks, sharding, chunks and tensor places.
bool SameLayout(const Engine::Impl& s, const ckpt::Manifest& m) {
  const CheckpointInfo& i = m.info;
  const bool sharded = i.stage > 0 && i.world_size > 1, shards = s.stage > 0 && s.world_size > 1;
  if (i.world_size != s.world_size || sharded != shards || i.chunk_elems != s.layout.chunk_elems ||
      i.num_chunks != s.layout.num_chunks || i.chunk_bytes != ckpt::ChunkBytes(s) ||
      i.shard_elems != s.opt_elems)
    return false;
  for (size_t t = 0; t < m.tensors.size(); ++t) {
    const zero::TensorPlace& p = s.layout.tensors[t];
    if (m.tensors[t].chunk != p.chunk || m.tensors[t].offset != p.offset) return false;
  }
  return true;
}

std::string DescribeLayout(int world, int stage, int chunks, int64_t chunk_elems) {
  return std::to_string(world) + (world == 1 ? " rank" : " ranks") + " at stage " + std::to_string(stage) +
         ", " + std::to_string(chunks) + (chunks == 1 ? " chunk" : " chunks") + " of " +
         std::to_string(chunk_elems) + " elements";
}

// Where a load takes the state from: the rank's own files, or (another layout) values
// pulled from every saving rank's.
struct LoadSource {
  ckpt::StateReaders files;
  std::unique_ptr<ckpt::ReshardSource> reshard;
};

// Phase one: nothing of the engine changes.
Result<LoadSource> PrepareLoad(Engine::Impl& s, Engine& engine, const std::string& dir, IoEngine** io,
                               std::unique_ptr<IoEngine>* own_io, ckpt::Manifest* m) {
  STRATA_RETURN_IF_ERROR(ckpt::CheckCanCheckpoint(s, "LoadCheckpoint"));
  STRATA_RETURN_IF_ERROR(engine.Flush());
  STRATA_ASSIGN_OR_RETURN(*m, ckpt::ReadManifest(dir));
  STRATA_RETURN_IF_ERROR(CheckFits(s, *m, dir));
  STRATA_ASSIGN_OR_RETURN(*io, ckpt::CheckpointIo(s, own_io));
  LoadSource src;
  if (SameLayout(s, *m)) {
    STRATA_ASSIGN_OR_RETURN(src.files,
                            ckpt::OpenStateFiles(s, **io, dir, *m, m->info.state_ranks == 1 ? 0 : s.rank));
    return src;
  }
  if (s.rank == 0) {
    STRATA_LOG(kInfo, "ckpt") << "resharding " << dir << ": saved by "
                              << DescribeLayout(m->info.world_size, m->info.stage, m->info.num_chunks,
                                                m->info.chunk_elems)
                              << "; loaded by "
                              << DescribeLayout(s.world_size, s.stage, s.layout.num_chunks,
                                                s.layout.chunk_elems);
  }
  STRATA_ASSIGN_OR_RETURN(
      src.reshard, ckpt::ReshardSource::Open(**io, s.arena, dir, *m, s.layout, s.opt_offset, s.opt_elems));
  // Before anything changes: a corrupt section then leaves the engine as it was.
  STRATA_RETURN_IF_ERROR(src.reshard->Verify());
  return src;
}

// The scalars, the recorded call order, and the compute parameters from the master.
Status RestoreRest(Engine::Impl& s, const ckpt::Manifest& m) {
  s.step_count = m.info.optimizer_steps;
  s.adam.step = s.step_count + 1;
  s.adam.lr = static_cast<float>(m.info.lr);
  s.resumed_step_calls = m.info.step_calls - s.step_epoch;
  if (m.scaler_dynamic && s.scaler->dynamic()) s.scaler->Restore(m.scaler);
  // Replayed as one micro-batch's uses: the engine then expects the saving run's order.
  for (const auto& [kind, module] : m.call_order) s.order->Note(static_cast<zero::UseKind>(kind), module);
  (void)s.order->EndMicroBatch();
  for (int c = 0; c < s.layout.num_chunks; ++c) STRATA_RETURN_IF_ERROR(s.RestoreParams(c));
  return OkStatus();
}

}  // namespace

Status Engine::LoadCheckpoint(const std::string& dir_arg, CheckpointMeta* meta) {
  Impl& s = *impl_;
  if (s.pending_save) STRATA_RETURN_IF_ERROR(FinishCheckpoint().status());
  s.window_disturbed = true;
  const auto start = std::chrono::steady_clock::now();
  const std::string dir = ckpt::TrimDir(dir_arg);
  const std::string what = "LoadCheckpoint(" + dir + ")";
  ckpt::Manifest m;
  IoEngine* io = nullptr;
  std::unique_ptr<IoEngine> own_io;
  auto source = PrepareLoad(s, *this, dir, &io, &own_io, &m);
  STRATA_RETURN_IF_ERROR(ckpt::AgreeOnStatus(s, source.status(), what));

  // From here a failure leaves the state part old, part new: the engine trains no more.
  auto fail = [&](Status st) {
    if (s.failed.ok()) {
      s.failed = st;
      s.failed_call = what;
    }
    return st;
  };
  if (s.stage == 3) {
    Status dropped = s.DropGathered();  // an evaluation pass may have left chunks gathered
    if (!dropped.ok()) return fail(ckpt::AgreeOnStatus(s, dropped, what));
  }
  if (s.opt_tier == ZeroTier::kNvme) {
    Status dropped = s.nvme_opt->DropReads();
    if (!dropped.ok()) return fail(ckpt::AgreeOnStatus(s, dropped, what));
  }
  Status st = ckpt::AgreeOnStatus(
      s, source->reshard ? ckpt::RestoreResharded(s, *source->reshard) : ckpt::RestoreState(s, source->files),
      what);
  *source = {};  // close the files before the parameters are republished
  if (st.ok()) st = ckpt::AgreeOnStatus(s, RestoreRest(s, m), what);
  if (st.ok()) st = ckpt::AgreeOnStatus(s, s.AllGatherParams(), what);
  if (!st.ok()) return fail(st);
  if (meta != nullptr) {
    meta->json = m.info.meta_json;
    meta->step_calls = m.info.step_calls;
    meta->optimizer_steps = m.info.optimizer_steps;
  }
  STRATA_LOG(kInfo, "ckpt") << "rank " << s.rank << " loaded " << dir << " (step " << m.info.step_calls
                            << ") in "
                            << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()
                            << " s";
  return OkStatus();
}

}  // namespace strata
