// Grid-wide steps every kernel family shares: programmatic dependent launch, and "which CTA finished
// last" (a GPU-scope count: the last CTA may reset the kernel's private state; a signal that publishes
// data to peers fences first, as HT's signal_done).
#pragma once

#include <cstdint>

#include "transport/device/flags.cuh"

namespace epx::kernels {

constexpr int kWarp = 32;

// Programmatic dependent launch: a kernel launched after another with programmatic stream
// serialization may start once every CTA of the one before has called allow_dependent_launch (or
// exited); before it reads anything that kernel wrote, it calls wait_for_prior_grid, which returns once
// that kernel has completed and its writes are visible. Without such a launch both return at once.
__device__ inline void allow_dependent_launch() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ inline void wait_for_prior_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// Called by every thread of every CTA once its own accesses of the kernel are issued. Each CTA:
// __syncthreads; thread 0 adds one to `blocks_done`, a private counter that is zero between kernels. The
// CTA that brings it to gridDim.x is the last: it resets the counter (and `work_claimed`, a kernel's
// private count of claimed work items, when given: every CTA claims its last item before it counts itself
// done). Returns true on every thread of the last CTA.
// The add is a GPU-scope acquire-release (a fence first: the thread waits until its earlier accesses are
// performed), so every CTA's accesses before its add are ordered before what the last CTA does next on
// this GPU (HT, whose last CTA goes on to wait for and read what peers and CTAs wrote). It publishes
// nothing to peers; a signal that publishes data fences on its own, as HT's signal_done.
__device__ inline bool last_cta_done(uint32_t* blocks_done, uint32_t* work_claimed = nullptr) {
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t before = transport::add_acq_rel_gpu(blocks_done, 1u);
    last = before == gridDim.x - 1;
    if (last) {
      *blocks_done = 0;
      if (work_claimed != nullptr) *work_claimed = 0;
    }
  }
  __syncthreads();
  return last;
}

}  // namespace epx::kernels
