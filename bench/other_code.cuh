// Other code: a kernel body of ~105 KB of instructions that does nothing useful, for measuring what a
// kernel pays to fetch its own code (epx-start-probe) and for timing LL calls whose code is no longer in
// the SMs' instruction caches (the LL bench's "cold" column), as in a decode step where other kernels run
// between the calls.
#pragma once

#include <cstdint>
#include <utility>

namespace epx::bench {

inline constexpr int kOtherCodeStages = 64;
inline constexpr int kOtherCodeOpsPerSide = 32;
inline constexpr int kOtherCodeAccumulators = 8;

// One stage: one of two blocks of operations, by bit kStage % 32 of `pick`, so that a pass runs half of
// the code laid out, as a kernel's common paths lie between its rare ones. The operations of a block do
// not depend on each other in a chain (8 accumulators). kSalt gives each instantiation its own constants,
// hence its own code.
template <int kSalt, int kStage>
__device__ __forceinline__ void other_code_stage(uint32_t (&x)[kOtherCodeAccumulators], uint32_t pick) {
  constexpr int A = kOtherCodeAccumulators;
  if ((pick >> (kStage % 32)) & 1u) {
#pragma unroll
    for (int i = 0; i < kOtherCodeOpsPerSide; ++i) {
      x[i % A] = __funnelshift_l(x[i % A], x[(i + 3) % A], (kStage + i) % 31 + 1) ^
                 (0x9E3779B9u * uint32_t(kSalt * 8191 + kStage * 64 + i + 1));
    }
  } else {
#pragma unroll
    for (int i = 0; i < kOtherCodeOpsPerSide; ++i) {
      x[i % A] = __funnelshift_r(x[i % A], x[(i + 5) % A], (kStage + i) % 29 + 2) +
                 (0x85EBCA6Bu * uint32_t(kSalt * 8191 + kStage * 64 + i + 7));
    }
  }
}

template <int kSalt, int... kStage>
__device__ __forceinline__ void other_code_stages(uint32_t (&x)[kOtherCodeAccumulators], uint32_t pick,
                                                  std::integer_sequence<int, kStage...>) {
  (other_code_stage<kSalt, kStage>(x, pick), ...);
}

// One pass over every stage (half of the code, chosen by `pick`).
template <int kSalt>
__device__ __forceinline__ void other_code_pass(uint32_t (&x)[kOtherCodeAccumulators], uint32_t pick) {
  other_code_stages<kSalt>(x, pick, std::make_integer_sequence<int, kOtherCodeStages>{});
}

// Runs the whole of other_code_pass<kSalt> (a pass with `pick`, one with ~pick) on the first warp of
// each CTA: launched with a CTA or more per SM, it leaves that code in every SM's instruction caches.
// The result goes to *sink when it equals `pick` (never, in practice; the compiler cannot know).
template <int kSalt>
__global__ void other_code_kernel(uint32_t pick, uint32_t* sink) {
  if (threadIdx.x >= 32) return;
  uint32_t x[kOtherCodeAccumulators];
#pragma unroll
  for (int i = 0; i < kOtherCodeAccumulators; ++i) x[i] = threadIdx.x * 17u + uint32_t(i);
#pragma unroll 1
  for (int pass = 0; pass < 2; ++pass) other_code_pass<kSalt>(x, pass == 0 ? pick : ~pick);
  uint32_t sum = 0;
#pragma unroll
  for (int i = 0; i < kOtherCodeAccumulators; ++i) sum ^= x[i];
  if (sum == pick) *sink = sum;
}

}  // namespace epx::bench
