// Hand-worked cases for the scalar formats (BF16, FP8 E4M3) and the power-of-two ceiling.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

#include "epx/reference/numeric.hpp"

namespace epx::ref {
namespace {

float from_bits(uint32_t bits) { return std::bit_cast<float>(bits); }
float pow2(int exponent) { return static_cast<float>(std::ldexp(1.0, exponent)); }

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16(-2.5f), 0xC020);
  EXPECT_EQ(float_to_bf16(from_bits(0x3F808000)), 0x3F80);  // 1 + 2^-8: tie, 0x3F80 is even
  EXPECT_EQ(float_to_bf16(from_bits(0x3F818000)), 0x3F82);  // 1 + 3*2^-8: tie, round up to even
  EXPECT_EQ(float_to_bf16(from_bits(0x3F808001)), 0x3F81);  // just above the tie
  EXPECT_EQ(float_to_bf16(from_bits(0x3F817FFF)), 0x3F81);  // just below the tie
  EXPECT_EQ(float_to_bf16(from_bits(0x3F80FFFF)), 0x3F81);
  EXPECT_EQ(float_to_bf16(from_bits(0x3FFF8000)), 0x4000);  // carry into the exponent
}

TEST(Bf16, SpecialValues) {
  EXPECT_EQ(float_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(float_to_bf16(from_bits(0x7FC00000)), 0x7FFF);  // every NaN -> canonical 0x7FFF
  EXPECT_EQ(float_to_bf16(from_bits(0xFF800001)), 0x7FFF);
  EXPECT_EQ(float_to_bf16(from_bits(0x7F800001)), 0x7FFF);  // would round to inf bits if not caught
  EXPECT_EQ(float_to_bf16(from_bits(0x7F7FFFFF)), 0x7F80);  // FLT_MAX rounds up to infinity
  EXPECT_EQ(float_to_bf16(from_bits(0x7F7F7FFF)), 0x7F7F);
  EXPECT_EQ(float_to_bf16(from_bits(0x00000001)), 0x0000);  // float subnormals
  EXPECT_EQ(float_to_bf16(from_bits(0x00008000)), 0x0000);
  EXPECT_EQ(float_to_bf16(from_bits(0x00018000)), 0x0002);
}

TEST(Bf16, ToFloatIsExact) {
  EXPECT_EQ(bf16_to_float(0x3F80), 1.0f);
  EXPECT_EQ(bf16_to_float(0xC020), -2.5f);
  EXPECT_EQ(bf16_to_float(0x0001), pow2(-133));
  EXPECT_EQ(bf16_to_float(0x7F80), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(bf16_to_float(0x7FFF)));
  EXPECT_TRUE(std::signbit(bf16_to_float(0x8000)));
}

TEST(E4m3, DecodesEveryKindOfCode) {
  EXPECT_EQ(e4m3_to_float(0x00), 0.0f);
  EXPECT_FALSE(std::signbit(e4m3_to_float(0x00)));
  EXPECT_TRUE(std::signbit(e4m3_to_float(0x80)));
  EXPECT_EQ(e4m3_to_float(0x01), pow2(-9));         // smallest subnormal
  EXPECT_EQ(e4m3_to_float(0x07), 7.0f * pow2(-9));  // largest subnormal
  EXPECT_EQ(e4m3_to_float(0x08), pow2(-6));         // smallest normal
  EXPECT_EQ(e4m3_to_float(0x0F), 15.0f * pow2(-9));
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_float(0x3C), 1.5f);
  EXPECT_EQ(e4m3_to_float(0x77), 240.0f);
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0xFE), -448.0f);
  EXPECT_EQ(e4m3_to_float(0xC0), -2.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xFF)));
}

TEST(E4m3, EncodesWithRoundToNearestEven) {
  EXPECT_EQ(float_to_e4m3(1.0f), 0x38);
  EXPECT_EQ(float_to_e4m3(1.5f), 0x3C);
  EXPECT_EQ(float_to_e4m3(1.0625f), 0x38);  // tie between 1 (m=0) and 1.125 (m=1): even
  EXPECT_EQ(float_to_e4m3(1.1875f), 0x3A);  // tie between 1.125 (m=1) and 1.25 (m=2): even
  EXPECT_EQ(float_to_e4m3(1.07f), 0x39);    // above the tie
  EXPECT_EQ(float_to_e4m3(272.0f), 0x78);   // tie between 256 and 288: 256
  EXPECT_EQ(float_to_e4m3(304.0f), 0x7A);   // tie between 288 and 320: 320
  EXPECT_EQ(float_to_e4m3(440.0f), 0x7E);   // rounds up to 448
  EXPECT_EQ(float_to_e4m3(416.0f), 0x7D);
  EXPECT_EQ(float_to_e4m3(-2.0f), 0xC0);
}

TEST(E4m3, EncodesSubnormalsAndTheirBoundaries) {
  EXPECT_EQ(float_to_e4m3(pow2(-9)), 0x01);
  EXPECT_EQ(float_to_e4m3(pow2(-10)), 0x00);              // half the smallest subnormal: tie to 0
  EXPECT_EQ(float_to_e4m3(from_bits(0x3A800001)), 0x01);  // just above 2^-10
  EXPECT_EQ(float_to_e4m3(3.0f * pow2(-10)), 0x02);       // 1.5 units: tie to 2
  EXPECT_EQ(float_to_e4m3(5.0f * pow2(-10)), 0x02);       // 2.5 units: tie to 2
  EXPECT_EQ(float_to_e4m3(7.5f * pow2(-9)), 0x08);        // tie between 0x07 and 0x08: 0x08
  EXPECT_EQ(float_to_e4m3(15.5f * pow2(-9)), 0x10);       // tie between 0x0F and 2^-5
  EXPECT_EQ(float_to_e4m3(pow2(-6)), 0x08);
  EXPECT_EQ(float_to_e4m3(-pow2(-12)), 0x80);  // underflow keeps the sign
  EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(float_to_e4m3(0.0f), 0x00);
}

TEST(E4m3, SaturatesAndMapsNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(float_to_e4m3(448.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3(449.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3(463.99f), 0x7E);
  EXPECT_EQ(float_to_e4m3(464.0f), 0x7E);  // would round to 480, which does not exist
  EXPECT_EQ(float_to_e4m3(480.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3(1e30f), 0x7E);
  EXPECT_EQ(float_to_e4m3(inf), 0x7E);
  EXPECT_EQ(float_to_e4m3(-inf), 0xFE);
  EXPECT_EQ(float_to_e4m3(-500.0f), 0xFE);
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(float_to_e4m3(from_bits(0xFFC00001)), 0x7F);  // negative NaN too
}

TEST(E4m3, EveryFiniteCodeRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7F) == 0x7F) continue;  // NaN
    EXPECT_EQ(float_to_e4m3(e4m3_to_float(static_cast<uint8_t>(code))), code) << "code " << code;
  }
}

TEST(CeilToPowerOfTwo, ComputesFromBits) {
  EXPECT_EQ(ceil_to_power_of_two(1.0f), 1.0f);
  EXPECT_EQ(ceil_to_power_of_two(3.0f), 4.0f);
  EXPECT_EQ(ceil_to_power_of_two(4.0f), 4.0f);
  EXPECT_EQ(ceil_to_power_of_two(4.0001f), 8.0f);
  EXPECT_EQ(ceil_to_power_of_two(0.3f), 0.5f);
  EXPECT_EQ(ceil_to_power_of_two(1e-4f / 448.0f), pow2(-22));  // the floored FP8 scale
  EXPECT_EQ(ceil_to_power_of_two(pow2(-140)), pow2(-140));     // subnormal power of two
  EXPECT_EQ(ceil_to_power_of_two(3.0f * pow2(-149)), 4.0f * pow2(-149));
  EXPECT_EQ(ceil_to_power_of_two(from_bits(0x007FFFFF)), pow2(-126));  // largest subnormal
  EXPECT_EQ(ceil_to_power_of_two(from_bits(0x7F7FFFFF)), std::numeric_limits<float>::infinity());
  EXPECT_THROW(ceil_to_power_of_two(0.0f), std::invalid_argument);
  EXPECT_THROW(ceil_to_power_of_two(-1.0f), std::invalid_argument);
}

}  // namespace
}  // namespace epx::ref
