#include "epx/reference/numeric.hpp"

#include <bit>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace epx::ref {

uint32_t float_to_bits(float value) { return std::bit_cast<uint32_t>(value); }
float bits_to_float(uint32_t bits) { return std::bit_cast<float>(bits); }

float bf16_to_float(uint16_t bits) { return bits_to_float(static_cast<uint32_t>(bits) << 16); }

uint16_t float_to_bf16(float value) {
  if (std::isnan(value)) return kBf16CanonicalNaN;
  const uint32_t bits = float_to_bits(value);
  const uint32_t kept = bits >> 16;         // sign, exponent and top 7 mantissa bits
  const uint32_t dropped = bits & 0xFFFFu;  // the 16 bits rounded away
  const uint32_t half = 0x8000u;
  // Round to nearest; on an exact tie round to the even kept value. A carry out of the mantissa
  // correctly moves into the exponent (and the largest finite values round up to infinity).
  const bool round_up = dropped > half || (dropped == half && (kept & 1u) != 0);
  return static_cast<uint16_t>(kept + (round_up ? 1u : 0u));
}

namespace {
// E4M3 layout constants.
constexpr int kE4m3Bias = 7;
constexpr int kE4m3MantissaBits = 3;
constexpr int kE4m3MinNormalExp = 1 - kE4m3Bias;                             // 2^-6
constexpr int kE4m3SubnormalUlpExp = kE4m3MinNormalExp - kE4m3MantissaBits;  // 2^-9

// Rounds a non-negative double holding an integer plus a fraction to the nearest integer, ties to
// even. Written out rather than relying on the current floating-point rounding mode.
double round_half_even(double q) {
  const double lower = std::floor(q);
  const double fraction = q - lower;  // exact: q has few significant bits
  if (fraction > 0.5) return lower + 1.0;
  if (fraction < 0.5) return lower;
  return std::fmod(lower, 2.0) == 0.0 ? lower : lower + 1.0;
}

// Encodes a non-negative value that is exactly representable in E4M3 (0 <= v <= 448).
uint8_t encode_e4m3_magnitude(double v) {
  const double min_normal = std::ldexp(1.0, kE4m3MinNormalExp);
  if (v < min_normal) {
    // Subnormal (or zero): exponent field 0, value = mantissa * 2^-9.
    return static_cast<uint8_t>(v / std::ldexp(1.0, kE4m3SubnormalUlpExp));
  }
  const int exponent = std::ilogb(v);                        // floor(log2(v)), exact
  const double significand = v / std::ldexp(1.0, exponent);  // in [1, 2), exact
  const int mantissa = static_cast<int>((significand - 1.0) * (1 << kE4m3MantissaBits));
  return static_cast<uint8_t>(((exponent + kE4m3Bias) << kE4m3MantissaBits) | mantissa);
}
}  // namespace

float e4m3_to_float(uint8_t bits) {
  const bool negative = (bits & 0x80u) != 0;
  const int exponent_field = (bits >> kE4m3MantissaBits) & 0xF;
  const int mantissa = bits & 0x7;
  if ((bits & 0x7Fu) == 0x7Fu) return std::numeric_limits<float>::quiet_NaN();
  double magnitude;
  if (exponent_field == 0) {
    magnitude = std::ldexp(static_cast<double>(mantissa), kE4m3SubnormalUlpExp);
  } else {
    magnitude = std::ldexp(static_cast<double>(8 + mantissa), exponent_field - kE4m3Bias - kE4m3MantissaBits);
  }
  return static_cast<float>(negative ? -magnitude : magnitude);
}

uint8_t float_to_e4m3(float value) {
  if (std::isnan(value)) return kE4m3NaN;
  const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  const double magnitude = std::fabs(static_cast<double>(value));  // exact
  // Satfinite: everything above the largest finite value (including +-inf) clamps to +-448.
  // (Values in (448, 464) would round to 448 anyway; >= 464 would round to the missing 480.)
  if (magnitude > kE4m3MaxFinite) return sign | 0x7E;
  // Spacing of the E4M3 grid around `magnitude`: 2^(e-3) in the normal binade [2^e, 2^(e+1)),
  // and the fixed subnormal spacing 2^-9 below 2^-6.
  const double min_normal = std::ldexp(1.0, kE4m3MinNormalExp);
  const int binade = magnitude >= min_normal ? std::ilogb(magnitude) : kE4m3MinNormalExp;
  const double spacing = std::ldexp(1.0, binade - kE4m3MantissaBits);
  // magnitude / spacing is exact (power-of-two scaling of a float, held in a double).
  const double rounded = round_half_even(magnitude / spacing) * spacing;
  return sign | encode_e4m3_magnitude(rounded);
}

float ceil_to_power_of_two(float value) {
  if (!(value > 0.0f)) throw std::invalid_argument("ceil_to_power_of_two: value must be > 0");
  const uint32_t bits = float_to_bits(value);
  const uint32_t exponent_mask = 0x7F800000u;
  const uint32_t mantissa_mask = 0x007FFFFFu;
  if ((bits & exponent_mask) == 0) {
    // Subnormal: value = mantissa * 2^-149, so the answer is bit_ceil(mantissa) * 2^-149,
    // whose bit pattern is bit_ceil(mantissa) itself (0x00800000 = 2^-126 when it carries).
    return bits_to_float(std::bit_ceil(bits & mantissa_mask));
  }
  if ((bits & mantissa_mask) == 0) return value;  // already a power of two (or +inf)
  // Drop the mantissa and add one to the exponent field.
  return bits_to_float((bits & exponent_mask) + 0x00800000u);
}

Matrix<float> bf16_to_float(const Matrix<uint16_t>& bits) {
  Matrix<float> out(bits.rows, bits.cols);
  for (std::size_t i = 0; i < bits.data.size(); ++i) out.data[i] = bf16_to_float(bits.data[i]);
  return out;
}

Matrix<uint16_t> float_to_bf16(const Matrix<float>& values) {
  Matrix<uint16_t> out(values.rows, values.cols);
  for (std::size_t i = 0; i < values.data.size(); ++i) out.data[i] = float_to_bf16(values.data[i]);
  return out;
}

}  // namespace epx::ref
