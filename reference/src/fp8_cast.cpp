#include "epx/reference/fp8_cast.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

#include "epx/reference/numeric.hpp"

namespace epx::ref {

float fp8_group_scale(float group_amax, bool round_scale) {
  const float amax = std::fmax(group_amax, kFp8AmaxFloor);
  float scale = amax / kE4m3MaxFinite;
  if (round_scale) scale = ceil_to_power_of_two(scale);
  return scale;
}

Fp8Rows cast_to_fp8(const Matrix<float>& x, bool round_scale) {
  if (x.cols % kFp8GroupSize != 0) {
    throw std::invalid_argument("cast_to_fp8: hidden size " + std::to_string(x.cols) + " is not a multiple of 128");
  }
  const int64_t num_groups = x.cols / kFp8GroupSize;
  Fp8Rows out{Matrix<uint8_t>(x.rows, x.cols), Matrix<float>(x.rows, num_groups)};
  for (int64_t t = 0; t < x.rows; ++t) {
    for (int64_t g = 0; g < num_groups; ++g) {
      const int64_t first = g * kFp8GroupSize;
      float amax = 0.0f;
      for (int64_t h = first; h < first + kFp8GroupSize; ++h) {
        amax = std::fmax(amax, std::fabs(x.at(t, h)));
      }
      const float scale = fp8_group_scale(amax, round_scale);
      const float inv_scale = 1.0f / scale;
      for (int64_t h = first; h < first + kFp8GroupSize; ++h) {
        out.values.at(t, h) = float_to_e4m3(x.at(t, h) * inv_scale);
      }
      out.scales.at(t, g) = scale;
    }
  }
  return out;
}

Matrix<float> dequantize_fp8(const Fp8Rows& fp8) {
  Matrix<float> out(fp8.values.rows, fp8.values.cols);
  for (int64_t t = 0; t < out.rows; ++t) {
    for (int64_t h = 0; h < out.cols; ++h) {
      out.at(t, h) = e4m3_to_float(fp8.values.at(t, h)) * fp8.scales.at(t, h / kFp8GroupSize);
    }
  }
  return out;
}

Matrix<int32_t> pack_ue8m0(const Matrix<float>& scales) {
  if (scales.cols % kUe8m0GroupsPerWord != 0) {
    throw std::invalid_argument("pack_ue8m0: number of groups " + std::to_string(scales.cols) +
                                " is not a multiple of 4 (hidden size must be a multiple of 512)");
  }
  Matrix<int32_t> packed(scales.rows, scales.cols / kUe8m0GroupsPerWord);
  for (int64_t t = 0; t < scales.rows; ++t) {
    for (int64_t g = 0; g < scales.cols; ++g) {
      const uint32_t bits = float_to_bits(scales.at(t, g));
      const uint32_t exponent = (bits >> 23) & 0xFFu;
      const bool positive_normal_power_of_two =
          (bits >> 31) == 0 && exponent != 0 && exponent != 0xFF && (bits & 0x007FFFFFu) == 0;
      if (!positive_normal_power_of_two) {
        throw std::invalid_argument("pack_ue8m0: scale at token " + std::to_string(t) + ", group " + std::to_string(g) +
                                    " is not a positive power of two (use round_scale)");
      }
      const int64_t word = g / kUe8m0GroupsPerWord;
      const int shift = static_cast<int>(8 * (g % kUe8m0GroupsPerWord));
      const uint32_t current = static_cast<uint32_t>(packed.at(t, word));
      packed.at(t, word) = static_cast<int32_t>(current | (exponent << shift));
    }
  }
  return packed;
}

Matrix<float> unpack_ue8m0(const Matrix<int32_t>& packed) {
  Matrix<float> scales(packed.rows, packed.cols * kUe8m0GroupsPerWord);
  for (int64_t t = 0; t < scales.rows; ++t) {
    for (int64_t g = 0; g < scales.cols; ++g) {
      const uint32_t word = static_cast<uint32_t>(packed.at(t, g / kUe8m0GroupsPerWord));
      const uint32_t exponent = (word >> (8 * (g % kUe8m0GroupsPerWord))) & 0xFFu;
      scales.at(t, g) = bits_to_float(exponent << 23);
    }
  }
  return scales;
}

}  // namespace epx::ref
