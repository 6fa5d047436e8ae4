// Per-token, per-128-column FP8 cast, dequantisation and UE8M0 packing (DESIGN.md §1.2).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "epx/reference/fp8_cast.hpp"
#include "test_support.hpp"

namespace epx::ref {
namespace {

float pow2(int exponent) { return static_cast<float>(std::ldexp(1.0, exponent)); }

// Group 0 has amax 1792 = 448 * 4, so its scale is exactly 4 and every product is exact.
// Group 1 is all zeros, so its amax is floored at 1e-4.
Matrix<float> power_of_two_row() {
  Matrix<float> x(1, 256, 0.0f);
  x.at(0, 0) = 1792.0f;       // / 4 = 448   -> 0x7E
  x.at(0, 1) = 4.0f;          // / 4 = 1     -> 0x38
  x.at(0, 2) = -8.0f;         // / 4 = -2    -> 0xC0
  x.at(0, 3) = pow2(-7);      // / 4 = 2^-9  -> 0x01 (smallest subnormal)
  x.at(0, 4) = pow2(-8);      // / 4 = 2^-10 -> tie between 0 and 2^-9: 0x00
  x.at(0, 5) = 3 * pow2(-8);  // / 4 = 1.5 * 2^-9 -> tie: 0x02
  x.at(0, 6) = 1.0f;          // / 4 = 0.25  -> 0x28
  return x;
}

TEST(Fp8Cast, PowerOfTwoScaleIsExact) {
  for (bool round_scale : {false, true}) {
    const Fp8Rows fp8 = cast_to_fp8(power_of_two_row(), round_scale);
    EXPECT_EQ(fp8.values.at(0, 0), 0x7E);
    EXPECT_EQ(fp8.values.at(0, 1), 0x38);
    EXPECT_EQ(fp8.values.at(0, 2), 0xC0);
    EXPECT_EQ(fp8.values.at(0, 3), 0x01);
    EXPECT_EQ(fp8.values.at(0, 4), 0x00);
    EXPECT_EQ(fp8.values.at(0, 5), 0x02);
    EXPECT_EQ(fp8.values.at(0, 6), 0x28);
    for (int64_t h = 7; h < 256; ++h) EXPECT_EQ(fp8.values.at(0, h), 0x00) << h;
    EXPECT_EQ(fp8.scales.at(0, 0), 4.0f);
    // Zero group: amax floored to 1e-4; rounded up, 1e-4/448 ~ 2.23e-7 becomes 2^-22 ~ 2.38e-7.
    EXPECT_EQ(fp8.scales.at(0, 1), round_scale ? pow2(-22) : 1e-4f / 448.0f);
  }
}

TEST(Fp8Cast, RoundScaleChangesTheValues) {
  Matrix<float> x(1, 128, 0.0f);
  x.at(0, 0) = 1344.0f;  // amax = 448 * 3: scale 3, or 4 when rounded up
  x.at(0, 1) = -3.0f;
  const Fp8Rows plain = cast_to_fp8(x, false);
  EXPECT_EQ(plain.scales.at(0, 0), 3.0f);
  EXPECT_EQ(plain.values.at(0, 0), 0x7E);  // 1344 * float(1/3) = 448.00001 -> 448
  EXPECT_EQ(plain.values.at(0, 1), 0xB8);  // -3 * float(1/3) rounds to -1.0f
  const Fp8Rows rounded = cast_to_fp8(x, true);
  EXPECT_EQ(rounded.scales.at(0, 0), 4.0f);
  EXPECT_EQ(rounded.values.at(0, 0), 0x7A);  // 336 = 1.3125 * 256: tie between 320 and 352 -> 320
  EXPECT_EQ(rounded.values.at(0, 1), 0xB4);  // -0.75
}

// The rule multiplies by 1.0f / scale; it does not divide by scale. amax = 452: scale =
// float(452 / 448) = 1.00892854, inv = float(1 / scale) = 0.991150498, and 84.75 * inv = 84.0000076
// in float, just above the tie at 84 between 80 and 88, so q = 88 (0x6B). 84.75 / scale would be
// exactly 84, a tie that rounds to 80 (0x6A).
TEST(Fp8Cast, MultipliesByTheInverseScale) {
  Matrix<float> x(1, 128, 0.0f);
  x.at(0, 0) = 452.0f;
  x.at(0, 1) = 84.75f;
  const Fp8Rows fp8 = cast_to_fp8(x, false);
  EXPECT_EQ(fp8.scales.at(0, 0), 452.0f / 448.0f);
  EXPECT_EQ(fp8.values.at(0, 1), 0x6B);
}

TEST(Fp8Cast, TinyAmaxIsFloored) {
  Matrix<float> x(1, 128, 0.0f);
  x.at(0, 0) = 1e-5f;
  x.at(0, 1) = pow2(-21);
  const Fp8Rows rounded = cast_to_fp8(x, true);
  EXPECT_EQ(rounded.scales.at(0, 0), pow2(-22));
  EXPECT_EQ(rounded.values.at(0, 1), 0x40);  // 2^-21 / 2^-22 = 2
  EXPECT_EQ(rounded.values.at(0, 0), 0x62);  // 1e-5 * 2^22 = 41.94 -> 40 (spacing 4 in [32, 64))
  const Fp8Rows plain = cast_to_fp8(x, false);
  EXPECT_EQ(plain.scales.at(0, 0), 1e-4f / 448.0f);
  EXPECT_EQ(plain.values.at(0, 1), 0x41);  // 2^-21 * 4.48e6 = 2.136 -> 2.25 (spacing 0.25)
}

TEST(Fp8Cast, TokensAreScaledIndependentlyAndNaNIsIgnoredByAmax) {
  Matrix<float> x(2, 128, 0.0f);
  x.at(0, 0) = 448.0f;
  x.at(1, 0) = 896.0f;
  x.at(1, 1) = std::numeric_limits<float>::quiet_NaN();
  const Fp8Rows fp8 = cast_to_fp8(x, false);
  EXPECT_EQ(fp8.scales.at(0, 0), 1.0f);
  EXPECT_EQ(fp8.scales.at(1, 0), 2.0f);
  EXPECT_EQ(fp8.values.at(0, 0), 0x7E);
  EXPECT_EQ(fp8.values.at(1, 0), 0x7E);
  EXPECT_EQ(fp8.values.at(1, 1), 0x7F);
}

TEST(Fp8Cast, RejectsHiddenNotMultipleOf128) {
  EXPECT_THROW(cast_to_fp8(Matrix<float>(1, 100), false), std::invalid_argument);
}

TEST(Fp8Cast, DequantizeMultipliesByTheScale) {
  const Fp8Rows fp8 = cast_to_fp8(power_of_two_row(), false);
  const Matrix<float> back = dequantize_fp8(fp8);
  EXPECT_EQ(back.at(0, 0), 1792.0f);
  EXPECT_EQ(back.at(0, 2), -8.0f);
  EXPECT_EQ(back.at(0, 3), pow2(-7));
  EXPECT_EQ(back.at(0, 4), 0.0f);
  EXPECT_EQ(back.at(0, 5), 2 * pow2(-7));
}

// Random data: the round trip error is at most half an E4M3 step, i.e. 2^-4 relative for normal
// values and scale * 2^-10 absolute in the subnormal range (plus a little float slack).
TEST(Fp8Cast, RandomRoundTripStaysWithinHalfAStep) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  Matrix<float> x(16, 512);
  for (float& v : x.data) v = dist(rng);
  for (bool round_scale : {false, true}) {
    const Fp8Rows fp8 = cast_to_fp8(x, round_scale);
    const Matrix<float> back = dequantize_fp8(fp8);
    for (int64_t t = 0; t < x.rows; ++t) {
      for (int64_t h = 0; h < x.cols; ++h) {
        const float scale = fp8.scales.at(t, h / 128);
        const float bound = std::fmax(std::fabs(x.at(t, h)) * 0.0625f, scale * pow2(-10)) * 1.0001f;
        ASSERT_LE(std::fabs(back.at(t, h) - x.at(t, h)), bound) << t << "," << h;
      }
    }
  }
}

TEST(Ue8m0, PacksExponentBytesLeastSignificantFirst) {
  const Matrix<float> scales = testing::matrix<float>(2, 4,
                                                      {1.0f, pow2(-22), 4.0f, 0.5f,  //
                                                       1.0f, 1.0f, 1.0f, 4.0f});
  const Matrix<int32_t> packed = pack_ue8m0(scales);
  ASSERT_EQ(packed.rows, 2);
  ASSERT_EQ(packed.cols, 1);
  // Bytes 0x7F (2^0), 0x69 (2^-22), 0x81 (2^2), 0x7E (2^-1).
  EXPECT_EQ(static_cast<uint32_t>(packed.at(0, 0)), 0x7E81697Fu);
  EXPECT_EQ(static_cast<uint32_t>(packed.at(1, 0)), 0x817F7F7Fu);  // negative as int32
  EXPECT_EQ(unpack_ue8m0(packed), scales);
}

TEST(Ue8m0, RoundTripsTheScalesOfARoundedCast) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-100.0f, 100.0f);
  Matrix<float> x(3, 1024);
  for (float& v : x.data) v = dist(rng);
  const Fp8Rows fp8 = cast_to_fp8(x, true);
  const Matrix<int32_t> packed = pack_ue8m0(fp8.scales);
  EXPECT_EQ(packed.cols, 2);
  EXPECT_EQ(unpack_ue8m0(packed), fp8.scales);
}

TEST(Ue8m0, RejectsScalesItCannotHold) {
  EXPECT_THROW(pack_ue8m0(testing::matrix<float>(1, 4, {1.0f, 3.0f, 1.0f, 1.0f})), std::invalid_argument);
  EXPECT_THROW(pack_ue8m0(testing::matrix<float>(1, 4, {1.0f, -2.0f, 1.0f, 1.0f})), std::invalid_argument);
  EXPECT_THROW(pack_ue8m0(Matrix<float>(1, 3, 1.0f)), std::invalid_argument);  // H not a multiple of 512
}

}  // namespace
}  // namespace epx::ref
