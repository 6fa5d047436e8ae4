// BF16 values as the kernels hold them: 8 to a 16-byte vector, two to a 32-bit word, element 2 j in the low
// half of word j. A BF16 is the upper half of its float's bits, so a value converts with one shift (even
// element) or one mask (odd element); the library conversion takes a byte permute and a shift for the odd one.
#pragma once

#include <cstdint>

namespace epx::kernels {

// Element i (0..7) of the 8 BF16 values in x, as a float (exact).
__device__ __forceinline__ float bf16_at(const uint4& x, int i) {
  const uint32_t w = (&x.x)[i / 2];
  return __uint_as_float(i % 2 == 0 ? w << 16 : w & 0xFFFF0000u);
}

}  // namespace epx::kernels
