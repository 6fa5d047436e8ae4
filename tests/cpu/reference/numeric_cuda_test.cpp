// The reference's BF16 and E4M3 casts against CUDA's own host implementations (cuda_bf16.h,
// cuda_fp8.h; only this test uses them, the library does not depend on CUDA).
//
// Coverage argument for the default test: both casts round a float to at most 8 significant bits
// (E4M3: 4, counting subnormals fewer; BF16: 8), so the result depends only on the sign, the exponent,
// the top 8 mantissa bits (kept bits + the round bit for every target exponent) and whether the
// low 15 mantissa bits are zero (the sticky bit). Sweeping all sign/exponent/top-8 combinations with
// low-15 patterns {0, 1, 0x4000, 0x7FFF, 0x2A5B} therefore visits every rounding class, including
// every E4M3 subnormal, every halfway point, the 448/464 saturation boundary, +-0, +-inf and NaNs.
// AllFloatBitPatterns (disabled by default; run with --gtest_also_run_disabled_tests) checks all 2^32.
#include <gtest/gtest.h>

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <bit>
#include <cstdint>

#include "epx/reference/numeric.hpp"

namespace epx::ref {
namespace {

uint8_t cuda_e4m3(float x) { return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)); }

uint16_t cuda_bf16(float x) { return __bfloat16_as_ushort(__float2bfloat16(x)); }

// Counts mismatches over floats whose bits satisfy the sweep described above.
TEST(NumericVsCuda, EveryRoundingClass) {
  const uint32_t low_patterns[] = {0x0000, 0x0001, 0x4000, 0x7FFF, 0x2A5B};
  int64_t fp8_mismatches = 0;
  int64_t bf16_mismatches = 0;
  for (uint32_t high = 0; high < (1u << 17); ++high) {  // sign, exponent, top 8 mantissa bits
    for (uint32_t low : low_patterns) {
      const float x = std::bit_cast<float>((high << 15) | low);
      if (float_to_e4m3(x) != cuda_e4m3(x) && ++fp8_mismatches <= 5) {
        ADD_FAILURE() << "e4m3 of bits 0x" << std::hex << ((high << 15) | low);
      }
      if (float_to_bf16(x) != cuda_bf16(x) && ++bf16_mismatches <= 5) {
        ADD_FAILURE() << "bf16 of bits 0x" << std::hex << ((high << 15) | low);
      }
    }
  }
  EXPECT_EQ(fp8_mismatches, 0);
  EXPECT_EQ(bf16_mismatches, 0);
}

TEST(NumericVsCuda, DISABLED_AllFloatBitPatterns) {
  int64_t fp8_mismatches = 0;
  int64_t bf16_mismatches = 0;
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFull; ++bits) {
    const float x = std::bit_cast<float>(static_cast<uint32_t>(bits));
    fp8_mismatches += float_to_e4m3(x) != cuda_e4m3(x);
    bf16_mismatches += float_to_bf16(x) != cuda_bf16(x);
  }
  EXPECT_EQ(fp8_mismatches, 0);
  EXPECT_EQ(bf16_mismatches, 0);
}

}  // namespace
}  // namespace epx::ref
