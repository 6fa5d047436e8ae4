// Per-token, per-128-column FP8 cast (DESIGN.md §1.2) and its UE8M0 scale packing.
//
// Normative rule, for each token t and column group g (columns [128 g, 128 g + 128)):
//   amax  = max(max over the group of |x|, 1e-4f)       (a NaN element is ignored, as fmaxf does)
//   scale = amax / 448.0f                                (one IEEE float division)
//   if round_scale: scale = smallest power of two >= scale (from the float bits, no log2f)
//   inv   = 1.0f / scale                                 (one IEEE float division)
//   q     = float_to_e4m3(x * inv)                       (one IEEE float multiply, then the
//                                                         satfinite E4M3 cast of numeric.hpp)
// Dequantise: float(q) * scale.
//
// UE8M0 packing (needs round_scale, so every scale is 2^n, and H % 512 == 0): the byte of a scale is
// its biased float exponent, (bits >> 23) & 0xFF. Groups 4w .. 4w+3 share int32 word w; group g sits
// in byte g % 4, least significant byte first:
//   word = byte(4w) | byte(4w+1) << 8 | byte(4w+2) << 16 | byte(4w+3) << 24.
#pragma once

#include <cstdint>

#include "epx/reference/tensor.hpp"

namespace epx::ref {

inline constexpr int64_t kFp8GroupSize = 128;      // columns sharing one scale
inline constexpr float kFp8AmaxFloor = 1e-4f;      // keeps scale > 0 for all-zero groups
inline constexpr int64_t kUe8m0GroupsPerWord = 4;  // scale bytes per packed int32

// FP8 values [T][H] with one float scale per 128 columns [T][H/128] (row-major).
struct Fp8Rows {
  Matrix<uint8_t> values;
  Matrix<float> scales;
};

// The scale of one group from its (unfloored) amax, following the rule above.
float fp8_group_scale(float group_amax, bool round_scale);

// Casts x [T][H] (H % 128 == 0, else std::invalid_argument).
Fp8Rows cast_to_fp8(const Matrix<float>& x, bool round_scale);

// float(q) * scale, element-wise.
Matrix<float> dequantize_fp8(const Fp8Rows& fp8);

// Packs float scales [T][G] (G % 4 == 0; every scale a positive normal power of two) into
// int32 [T][G/4]. Throws std::invalid_argument otherwise.
Matrix<int32_t> pack_ue8m0(const Matrix<float>& scales);

// Inverse of pack_ue8m0: byte b becomes the float with bits b << 23 (2^(b-127)).
Matrix<float> unpack_ue8m0(const Matrix<int32_t>& packed);

}  // namespace epx::ref
