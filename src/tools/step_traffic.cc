#include "tools/step_traffic.h"

#include <algorithm>

#include "zero/budget_check.h"

namespace strata::tools {
namespace {

double Align4K(double bytes) {
  return static_cast<double>((static_cast<uint64_t>(bytes) + 4095) / 4096 * 4096);
}

// The NVMe optimizer's state of one chunk's shard, as its live pieces are read and
// written (each piece's master, m and v padded to 4 KiB).
// `per_elem` bytes per element: 12 for the state; 4 for gradient pieces.
double PieceBytesPerChunk(const EngineLayoutInfo& l, double shard, double per_elem = 12) {
  if (l.optimizer_pieces <= 0 || l.optimizer_piece_elems <= 0) return Align4K(per_elem * shard);
  double bytes = 0, left = shard;
  for (int p = 0; p < l.optimizer_pieces; ++p) {
    const double elems = std::min<double>(left, static_cast<double>(l.optimizer_piece_elems));
    bytes += Align4K(per_elem * elems);
    left -= elems;
  }
  // Pieces wholly in padding move nothing; spread over the chunks they belong to.
  const double padding = static_cast<double>(l.optimizer_padding_pieces) / std::max(l.num_chunks, 1);
  return bytes * (1.0 - padding / l.optimizer_pieces);
}

}  // namespace

int ComputeBytes(const Config& c) { return c.bf16 || c.fp16.enabled ? 2 : 4; }

LaneWork PredictTraffic(const Config& c, int world_size, const EngineLayoutInfo& l) {
  LaneWork w;
  const int stage = c.zero.stage;
  const double chunks = l.num_chunks, chunk = static_cast<double>(l.chunk_elems);
  const double shard = static_cast<double>(l.shard_elems);
  const double opt = stage == 0 ? chunk : shard;  // elements this rank's optimizer steps
  const double cs = ComputeBytes(c), a = std::max(1, c.gradient_accumulation_steps);
  const OffloadDevice opt_dev = c.zero.offload_optimizer.device;
  const OffloadDevice par_dev = stage == 3 ? c.zero.offload_param.device : OffloadDevice::kNone;
  w.adam_params = chunks * opt;
  w.micro_batches = static_cast<int>(a);
  w.params_in_optimizer_state = l.params_in_optimizer_state;
  // offload_optimizer.ratio: these chunks' state and gradients stay on the device.
  const double on_device = l.optimizer_device_chunks;
  w.adam_params_device = on_device * opt;
  // Gradients are reduced after each micro-batch's backward, over the ranks.
  if (world_size > 1) w.comm_bytes += a * chunks * chunk * 4;
  if (world_size > 1 && (stage == 1 || stage == 2)) w.comm_bytes += chunks * chunk * cs;
  double gathers = 0;
  if (stage == 3) {
    // Each micro-batch gathers every chunk for the forward and again for the backward,
    // but for those kept between the two; carried chunks skip the next forward's.
    gathers = a * (2 * chunks - l.kept_chunks) - (a - 1) * l.carried_chunks;
    w.comm_bytes += gathers * chunk * cs;
    // A shard kept on the device (strata.param_on_device) is gathered from there, and
    // its step's values go up once. Its gathers are taken as a share of all of them.
    const double on_device = l.param_device_chunks;
    if (par_dev != OffloadDevice::kNone) w.copy_bytes += gathers * (chunks - on_device) / chunks * shard * cs;
    w.copy_bytes += on_device * opt * cs;
  }
  if (opt_dev != OffloadDevice::kNone)
    w.copy_bytes += a * (chunks - on_device) * opt * 4;  // gradients to the host
  // Updated values to the device: from the host optimizer below stage 3; at stage 3
  // through host staging into a device-resident shard (a host or NVMe tier takes them
  // without a device copy).
  if (stage < 3 && opt_dev != OffloadDevice::kNone) w.copy_bytes += (chunks - on_device) * opt * cs;
  if (stage == 3 && par_dev == OffloadDevice::kNone) w.copy_bytes += chunks * opt * cs;
  if (opt_dev == OffloadDevice::kNvme) {
    const double on_disk = chunks - l.optimizer_resident_chunks;
    const double state = on_disk * PieceBytesPerChunk(l, opt);  // read, and written back
    w.nvme_read_bytes += state;
    w.nvme_write_bytes += state;
    if (on_disk > 0) w.nvme_state = {state, state, on_disk * opt, std::max(1, l.optimizer_staging_sets)};
    if (l.gradients_on_nvme) {
      // Each micro-batch's shard but the last is written and read back by the next one's
      // to add to. The last goes to a speculative step from its pinned buffer, and is
      // written only where that step may be redone (clipping); a serial step writes it
      // and reads it back (c.strata.overlap: with "auto", the mode it starts in). In
      // pieces (no pinned shard holds one) every micro-batch's goes out and back. A
      // resident chunk's shard, and one kept on its own, waits in host memory.
      const bool pieces = l.gradient_pieces_on_nvme, overlap = c.strata.overlap;
      const double writes = pieces ? a : a - 1 + (overlap && c.gradient_clipping <= 0 ? 0 : 1);
      const double reads = pieces ? a : a - 1 + (overlap ? 0 : 1);
      const double slot = pieces ? PieceBytesPerChunk(l, opt, 4) : Align4K(opt * 4);
      const double grads_on_disk = on_disk - l.gradient_resident_chunks;
      w.nvme_write_bytes += writes * grads_on_disk * slot;
      w.nvme_read_bytes += reads * grads_on_disk * slot;
      // Before the last micro-batch: the first a-1 writes, and the reads of the 2nd to
      // (a-1)th micro-batches; the last one's read and the step's own come after.
      w.nvme_between_write_bytes = (a - 1) * grads_on_disk * slot;
      w.nvme_between_read_bytes = std::max(0.0, a - 2) * grads_on_disk * slot;
    }
  }
  if (par_dev == OffloadDevice::kNvme) {
    // Chunks whose shard stays in host or device memory (strata.param_resident,
    // param_on_device), or whose master does (optimizer_resident, where the gathers read
    // the master), read and write none; the others are read at every gather but the
    // forward's first of the chunks whose updated shard the step left in memory
    // (fresh_param_shards).
    const double on_disk =
        chunks - (l.params_in_optimizer_state ? l.optimizer_resident_chunks
                                              : l.param_resident_chunks + l.param_device_chunks);
    const double from_disk = std::max(0.0, gathers * on_disk / chunks - l.fresh_param_shards);
    // From the master: the live pieces' (a piece wholly in padding is not read).
    const double shard_read = l.params_in_optimizer_state ? PieceBytesPerChunk(l, shard, 4) : shard * cs;
    w.nvme_read_bytes += from_disk * shard_read;
    w.nvme_param_read_bytes = from_disk * shard_read;
    if (!l.params_in_optimizer_state) w.nvme_write_bytes += on_disk * opt * cs;
  }
  return w;
}

double PredictComputeSeconds(double flops_per_sample, int64_t micro_batch, int accumulation,
                             double flops_per_s) {
  if (flops_per_s <= 0) return 0;
  return flops_per_sample * static_cast<double>(micro_batch) * std::max(1, accumulation) / flops_per_s;
}

}  // namespace strata::tools
