// BF16 values as the kernels hold them (and make them): 8 to a 16-byte vector, two to a 32-bit word, element 2 j in the
// low half of word j. A BF16 is the upper half of its float's bits, so a value converts with one shift (even element)
// or one mask (odd element); the library conversion takes a byte permute and a shift for the odd one.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace epx::kernels {

// Element i (0..7) of the 8 BF16 values in x, as a float (exact).
__device__ __forceinline__ float bf16_at(const uint4& x, int i) {
  const uint32_t w = (&x.x)[i / 2];
  return __uint_as_float(i % 2 == 0 ? w << 16 : w & 0xFFFF0000u);
}

// 8 floats as the 8 BF16 values of a 16-byte vector, each rounded to nearest even.
__device__ __forceinline__ uint4 to_bf16(const float (&f)[8]) {
  uint4 out;
  uint32_t* w = &out.x;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    w[i] = *reinterpret_cast<const uint32_t*>(&pair);
  }
  return out;
}

}  // namespace epx::kernels
