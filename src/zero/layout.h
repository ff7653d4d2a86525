// The engine's parameter layout: every declared tensor placed once (a tensor shared by
// several modules is one parameter), in the order modules first use them, packed into
// equal chunks, each chunk sharded evenly over the ranks (engine.h). A tensor fits in one
// chunk, or is larger than a chunk and takes a run of whole chunks of its own, starting
// at a chunk's first element; the tensors after it pack into the run's last chunk.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "strata/module_hooks.h"
#include "strata/status.h"

namespace strata::zero {

struct TensorPlace {
  int chunk = 0;       // the first chunk it lies in
  int64_t offset = 0;  // element offset inside that chunk
  int64_t numel = 0;   // may run past the chunk's end, into the chunks after it (a run)
};

struct Layout {
  int world = 1;
  int64_t chunk_elems = 0;
  int64_t shard_elems = 0;  // chunk_elems / world
  int num_chunks = 0;
  int64_t num_params = 0;                             // each shared tensor counted once
  std::vector<TensorPlace> tensors;                   // by tensor id
  std::vector<std::vector<TensorId>> module_tensors;  // each module's tensor ids, declared order
  std::vector<std::vector<int>> module_chunks;        // chunks each module touches, ascending
  std::vector<int64_t> module_params;                 // parameters each module reads
  std::vector<std::vector<TensorId>> chunk_tensors;   // tensors with elements in each chunk
  // By chunk: the first chunk of the run it belongs to, or -1. A run's chunks hold one
  // tensor larger than a chunk (and what packs after it in the last one); the model
  // sees it whole, so its chunks' gathered values and gradients must be adjacent in
  // memory (the gatherer and the gradient buffers give each run a buffer of its own).
  std::vector<int> run_first;
  std::vector<int> run_length;  // by chunk: its run's chunk count (1 outside a run)
  // Element ranges of each chunk that hold no tensor (padding), [begin, end).
  std::vector<std::vector<std::pair<int64_t, int64_t>>> chunk_gaps;

  int num_modules() const { return static_cast<int>(module_tensors.size()); }
  int64_t ShardBegin(int rank) const { return rank * shard_elems; }
  bool InRun(int chunk) const { return run_first[chunk] >= 0; }
  int RunChunks() const {
    return static_cast<int>(std::count_if(run_first.begin(), run_first.end(), [](int f) { return f >= 0; }));
  }
  // Where tensor `id` starts in chunk `chunk`'s element coordinates: negative when it
  // began in an earlier chunk of its run. Its elements in the chunk are
  // [max(0, start), min(chunk_elems, start + numel)).
  int64_t StartIn(TensorId id, int chunk) const {
    return (tensors[id].chunk - static_cast<int64_t>(chunk)) * chunk_elems + tensors[id].offset;
  }
  // The chunks tensor `id` lies in, first to last.
  int FirstChunk(TensorId id) const { return tensors[id].chunk; }
  int LastChunk(TensorId id) const {
    return tensors[id].chunk + static_cast<int>((tensors[id].offset + tensors[id].numel - 1) / chunk_elems);
  }
};

// Elements per alignment unit: 2048 keeps 16-bit shards 4 KiB aligned.
inline constexpr int64_t kShardAlignElems = 2048;

// `chunk_bytes`: strata.chunk_size (bytes of fp32 parameters). The chunk is raised to
// the largest module (its tensors together) but outliers, rounded up to world x
// kShardAlignElems. Outliers are the modules more than kOutlierFactor times the median
// module, when they are at most a quarter of the modules (GPT-2's embedding and tied
// head beside its blocks); their tensors larger than the chunk take runs instead of
// making every chunk their size. InvalidArgument for a model ValidateModel refuses.
inline constexpr int64_t kOutlierFactor = 4;
Result<Layout> MakeLayout(const ModelDecl& model, uint64_t chunk_bytes, int world);

}  // namespace strata::zero
