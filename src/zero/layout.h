// The engine's parameter layout: every declared tensor placed once (a tensor shared by
// several modules is one parameter), in the order modules first use them, packed into
// equal chunks without spanning two, each chunk sharded evenly over the ranks (engine.h).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "strata/module_hooks.h"
#include "strata/status.h"

namespace strata::zero {

struct TensorPlace {
  int chunk = 0;
  int64_t offset = 0;  // element offset inside the chunk
  int64_t numel = 0;
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
  std::vector<std::vector<TensorId>> chunk_tensors;   // tensors placed in each chunk
  // Element ranges of each chunk that hold no tensor (padding), [begin, end).
  std::vector<std::vector<std::pair<int64_t, int64_t>>> chunk_gaps;

  int num_modules() const { return static_cast<int>(module_tensors.size()); }
  int64_t ShardBegin(int rank) const { return rank * shard_elems; }
};

// Elements per alignment unit: 2048 keeps 16-bit shards 4 KiB aligned.
inline constexpr int64_t kShardAlignElems = 2048;

// `chunk_bytes`: strata.chunk_size (bytes of fp32 parameters). The chunk is raised to
// the largest module (its tensors together) and rounded up to world x kShardAlignElems.
// InvalidArgument for a model ValidateModel refuses.
Result<Layout> MakeLayout(const ModelDecl& model, uint64_t chunk_bytes, int world);

}  // namespace strata::zero
