// Internal: runs fn(begin, end) over [0, n) in cache-sized tiles on oneTBB threads,
// inside `arena` when given. No allocation beyond oneTBB's own task objects.
#pragma once

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <cstddef>

#include "optim/kernels.h"

namespace strata::optim {

template <typename Fn>
void InArena(tbb::task_arena* arena, Fn&& fn) {
  if (arena != nullptr) {
    arena->execute(fn);
  } else {
    fn();
  }
}

template <typename Fn>
void ParallelTiles(size_t n, Fn&& fn) {
  if (n <= kTileElems) {  // one tile: no task overhead
    if (n > 0) fn(size_t{0}, n);
    return;
  }
  // Tiles on multiples of kTileElems, so only the last one has a ragged tail.
  const size_t tiles = (n + kTileElems - 1) / kTileElems;
  tbb::parallel_for(tbb::blocked_range<size_t>(0, tiles, 1), [&](const tbb::blocked_range<size_t>& r) {
    fn(r.begin() * kTileElems, r.end() * kTileElems < n ? r.end() * kTileElems : n);
  });
}

}  // namespace strata::optim
