// The engine's parameter layout: tensors in module order, packed into equal chunks
// without spanning two, each chunk sharded evenly over the ranks (see engine.h).
#pragma once

#include <cstdint>
#include <vector>

#include "strata/model.h"
#include "strata/status.h"

namespace strata::zero {

struct TensorPlace {
  int module = 0;
  int tensor = 0;
  int chunk = 0;
  int64_t offset = 0;  // element offset inside the chunk
  int64_t numel = 0;
};

struct Layout {
  int world = 1;
  int64_t chunk_elems = 0;
  int64_t shard_elems = 0;  // chunk_elems / world
  int num_chunks = 0;
  int64_t num_params = 0;
  std::vector<std::vector<TensorPlace>> tensors;  // [module][tensor]
  std::vector<std::vector<int>> module_chunks;    // chunks each module touches, ascending
  std::vector<int> chunk_first_module;            // lowest module with a tensor in the chunk
  std::vector<int> chunk_last_module;             // highest one
  std::vector<int> chunk_module_count;            // modules with a tensor in the chunk
  // Element ranges of each chunk that hold no tensor (padding), [begin, end).
  std::vector<std::vector<std::pair<int64_t, int64_t>>> chunk_gaps;

  int64_t ShardBegin(int rank) const { return rank * shard_elems; }
};

// Elements per alignment unit: 2048 keeps 16-bit shards 4 KiB aligned.
inline constexpr int64_t kShardAlignElems = 2048;

// `chunk_bytes`: strata.chunk_size (bytes of fp32 parameters). The chunk is raised to
// the largest tensor and rounded up to world x kShardAlignElems.
Result<Layout> MakeLayout(const std::vector<model::ModuleSpec>& modules, uint64_t chunk_bytes, int world);

}  // namespace strata::zero
