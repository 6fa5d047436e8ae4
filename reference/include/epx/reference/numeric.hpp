// Scalar number formats: BF16 and FP8 E4M3 (OCP "e4m3fn"), stored as raw bits.
//
// These are the normative conversions; GPU kernels must produce the same bits.
//   BF16  : 1 sign, 8 exponent, 7 mantissa bits = the top half of an IEEE float.
//   E4M3  : 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities; 0x7F and 0xFF are NaN;
//           largest finite 0x7E = 448; smallest subnormal 0x01 = 2^-9; smallest normal 0x08 = 2^-6.
#pragma once

#include <cstdint>

#include "epx/reference/tensor.hpp"

namespace epx::ref {

inline constexpr float kE4m3MaxFinite = 448.0f;
inline constexpr uint8_t kE4m3NaN = 0x7F;
inline constexpr uint16_t kBf16CanonicalNaN = 0x7FFF;

uint32_t float_to_bits(float value);
float bits_to_float(uint32_t bits);

// Exact: the BF16 bits become the high half of the float.
float bf16_to_float(uint16_t bits);

// Round to nearest, ties to even. Every NaN becomes the canonical quiet NaN 0x7FFF (what CUDA's
// __float2bfloat16 and the PTX cvt.rn.bf16.f32 produce); infinities and signed zeros are kept;
// finite values that round past the largest BF16 become infinity.
uint16_t float_to_bf16(float value);

// Exact. 0x7F/0xFF give a quiet NaN; 0x80 gives -0.0f.
float e4m3_to_float(uint8_t bits);

// Round to nearest, ties to even, saturating ("satfinite"): any |x| > 448, infinities included,
// becomes +-448 (0x7E / 0xFE); every NaN becomes 0x7F; the sign of zero (and of values that round
// to zero) is kept, so -tiny gives 0x80. Equals CUDA's
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) for every float.
uint8_t float_to_e4m3(float value);

// The smallest power of two >= value, computed from the float's bits (no log2f). Requires a
// positive finite value; +inf stays +inf. A normal input with a zero mantissa is returned as is.
float ceil_to_power_of_two(float value);

// BF16 bits for test data from the low 15 bits of `b`: any sign, exponents 2^-4 .. 2^3, any mantissa.
// Never zero, never NaN or infinite. Constexpr, so that kernels can make the same values.
constexpr uint16_t random_bf16(uint64_t b) {
  return uint16_t(((b & 1) << 15) | ((123 + (b >> 1) % 8) << 7) | ((b >> 8) & 0x7f));
}

// Element-wise BF16 <-> float over a whole matrix.
Matrix<float> bf16_to_float(const Matrix<uint16_t>& bits);
Matrix<uint16_t> float_to_bf16(const Matrix<float>& values);

}  // namespace epx::ref
