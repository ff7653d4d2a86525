// Engine::LoadCheckpoint: every rank reads the manifest and checks it against its engine
// and opens its state files before anything changes (the ranks agree on that), then
// streams the state into its tiers, restores the scalars and republishes the compute
// parameters from the restored master (the compute copy is the master rounded, as after
// every step), so the next Step() is the saving run's.
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

// InvalidArgument naming the first thing of the checkpoint that this engine cannot take.
Status CheckFits(const Engine::Impl& s, const ckpt::Manifest& m, const std::string& dir) {
  const CheckpointInfo& i = m.info;
  const std::string head = "checkpoint " + dir + " does not fit this engine: ";
  if (i.world_size != s.world_size) {
    return InvalidArgumentError(
        head + "it was saved by " + std::to_string(i.world_size) + " ranks, this engine has " +
        std::to_string(s.world_size) +
        "; loading at another world size (resharding) is not supported yet: resume with " +
        std::to_string(i.world_size) + " ranks");
  }
  const bool sharded = i.stage > 0 && i.world_size > 1, shards = s.stage > 0 && s.world_size > 1;
  if (sharded != shards) {
    return InvalidArgumentError(
        head + "it was saved at stage " + std::to_string(i.stage) +
        (sharded ? " (optimizer state sharded over the ranks)" : " (replicated on every rank)") +
        ", this engine runs stage " + std::to_string(s.stage) +
        "; switching between stage 0 and stages 1-3 with several ranks needs "
        "resharding, which is not supported yet");
  }
  if (i.chunk_elems != s.layout.chunk_elems || i.num_chunks != s.layout.num_chunks) {
    return InvalidArgumentError(head + "its layout has " + std::to_string(i.num_chunks) + " chunks of " +
                                std::to_string(i.chunk_elems) + " elements, this engine's " +
                                std::to_string(s.layout.num_chunks) + " of " +
                                std::to_string(s.layout.chunk_elems) +
                                " (a different model, or strata.chunk_size: resume with the saving run's)");
  }
  if (m.tensors.size() != s.layout.tensors.size()) {
    return InvalidArgumentError(head + "it holds " + std::to_string(m.tensors.size()) +
                                " tensors, this engine's model declares " +
                                std::to_string(s.layout.tensors.size()));
  }
  for (size_t t = 0; t < m.tensors.size(); ++t) {
    const ckpt::TensorEntry& e = m.tensors[t];
    const TensorDecl& d = s.model.tensors[t];
    const zero::TensorPlace& p = s.layout.tensors[t];
    if (e.name != d.name || e.shape != d.shape || e.chunk != p.chunk || e.offset != p.offset) {
      return InvalidArgumentError(head + "tensor " + std::to_string(t) + " is \"" + e.name + "\" " +
                                  Shape(e.shape) + " there, \"" + d.name + "\" " + Shape(d.shape) + " here");
    }
  }
  if (i.chunk_bytes != ckpt::ChunkBytes(s) || i.shard_elems != s.opt_elems) {
    return InvalidArgumentError(head + "its state files hold " + std::to_string(i.shard_elems) +
                                " elements per chunk, this engine steps " + std::to_string(s.opt_elems));
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

// Phase one: nothing of the engine changes.
Result<ckpt::StateReaders> PrepareLoad(Engine::Impl& s, Engine& engine, const std::string& dir, IoEngine** io,
                                       std::unique_ptr<IoEngine>* own_io, ckpt::Manifest* m) {
  STRATA_RETURN_IF_ERROR(ckpt::CheckCanCheckpoint(s, "LoadCheckpoint"));
  STRATA_RETURN_IF_ERROR(engine.Flush());
  STRATA_ASSIGN_OR_RETURN(*m, ckpt::ReadManifest(dir));
  STRATA_RETURN_IF_ERROR(CheckFits(s, *m, dir));
  STRATA_ASSIGN_OR_RETURN(*io, ckpt::CheckpointIo(s, own_io));
  return ckpt::OpenStateFiles(s, **io, dir, *m, m->info.state_ranks == 1 ? 0 : s.rank);
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
  s.window_disturbed = true;
  const std::string dir = ckpt::TrimDir(dir_arg);
  const std::string what = "LoadCheckpoint(" + dir + ")";
  ckpt::Manifest m;
  IoEngine* io = nullptr;
  std::unique_ptr<IoEngine> own_io;
  auto files = PrepareLoad(s, *this, dir, &io, &own_io, &m);
  STRATA_RETURN_IF_ERROR(ckpt::AgreeOnStatus(s, files.status(), what));

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
    Status dropped = s.DropNvmeReads();
    if (!dropped.ok()) return fail(ckpt::AgreeOnStatus(s, dropped, what));
  }
  Status st = ckpt::AgreeOnStatus(s, ckpt::RestoreState(s, *files), what);
  files->reader = {};  // close the files before the parameters are republished
  if (st.ok()) st = ckpt::AgreeOnStatus(s, RestoreRest(s, m), what);
  if (st.ok()) st = ckpt::AgreeOnStatus(s, s.AllGatherParams(), what);
  if (!st.ok()) return fail(st);
  if (meta != nullptr) {
    meta->json = m.info.meta_json;
    meta->step_calls = m.info.step_calls;
    meta->optimizer_steps = m.info.optimizer_steps;
  }
  STRATA_LOG(kInfo, "ckpt") << "rank " << s.rank << " loaded " << dir << " (step " << m.info.step_calls
                            << ")";
  return OkStatus();
}

}  // namespace strata
