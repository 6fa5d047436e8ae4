// Warp-cooperative row moves for the HT kernels.
#pragma once

#include <cstdint>

#include "kernels/common/grid.cuh"

namespace epx::kernels::ht {

// A read-once load that bypasses L1 (inputs are streamed, never re-read by this CTA).
__device__ __forceinline__ int4 load_stream(const int4* p) {
  int4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

}  // namespace epx::kernels::ht
