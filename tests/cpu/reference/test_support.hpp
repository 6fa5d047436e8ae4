// Helpers shared by the reference's unit tests: literal matrices, exact BF16 literals and random
// routings. Expected values in the tests are written by hand; nothing here calls the code under test.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <random>
#include <stdexcept>
#include <vector>

#include "epx/reference/tensor.hpp"

namespace epx::ref::testing {

// A row-major matrix from a literal list of rows * cols values.
template <class T>
Matrix<T> matrix(int64_t rows, int64_t cols, std::initializer_list<T> values) {
  if (static_cast<int64_t>(values.size()) != rows * cols) throw std::logic_error("matrix: wrong literal size");
  Matrix<T> m(rows, cols);
  m.data.assign(values.begin(), values.end());
  return m;
}

// The BF16 bits of a float that BF16 holds exactly (the float's low 16 bits must be zero).
inline uint16_t exact_bf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0xFFFFu) != 0) throw std::logic_error("exact_bf16: value not representable in BF16");
  return static_cast<uint16_t>(bits >> 16);
}

inline float bf16_value(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

// A BF16 matrix [values.size()][hidden] whose row i holds values[i] in every column.
inline Matrix<uint16_t> constant_rows(int64_t hidden, std::initializer_list<float> values) {
  Matrix<uint16_t> m(static_cast<int64_t>(values.size()), hidden);
  int64_t row = 0;
  for (float v : values) {
    for (int64_t h = 0; h < hidden; ++h) m.at(row, h) = exact_bf16(v);
    ++row;
  }
  return m;
}

// A BF16 value k * 2^j with |k| <= 31 and j in [-4, 4]: 5 significant bits, so sums of up to 8 copies
// stay exact in BF16.
inline uint16_t small_bf16(std::mt19937& rng) {
  const int k = std::uniform_int_distribution<int>(-31, 31)(rng);
  const int j = std::uniform_int_distribution<int>(-4, 4)(rng);
  return exact_bf16(static_cast<float>(k) * static_cast<float>(std::ldexp(1.0, j)));
}

inline Matrix<uint16_t> random_small_bf16(std::mt19937& rng, int64_t rows, int64_t cols) {
  Matrix<uint16_t> m(rows, cols);
  for (uint16_t& v : m.data) v = small_bf16(rng);
  return m;
}

// A [T][K] routing with distinct experts per token; each slot is -1 with probability p_empty.
inline Matrix<int64_t> random_topk(std::mt19937& rng, int64_t num_tokens, int64_t topk, int num_experts,
                                   double p_empty) {
  Matrix<int64_t> idx(num_tokens, topk, -1);
  std::bernoulli_distribution empty(p_empty);
  for (int64_t t = 0; t < num_tokens; ++t) {
    std::vector<int64_t> experts(static_cast<std::size_t>(num_experts));
    for (int e = 0; e < num_experts; ++e) experts[static_cast<std::size_t>(e)] = e;
    std::shuffle(experts.begin(), experts.end(), rng);
    for (int64_t k = 0; k < topk; ++k) {
      if (!empty(rng)) idx.at(t, k) = experts[static_cast<std::size_t>(k)];
    }
  }
  return idx;
}

inline Matrix<float> random_weights(std::mt19937& rng, int64_t rows, int64_t cols) {
  Matrix<float> w(rows, cols);
  std::uniform_real_distribution<float> dist(0.0f, 1.0f);
  for (float& v : w.data) v = dist(rng);
  return w;
}

// One rank's random input: T uniform in [0, max_tokens], small exact BF16 values, distinct experts
// per token with empty slots at probability p_empty, weights uniform in [0, 1) (or all 1).
struct RandomRank {
  Matrix<uint16_t> x;
  Matrix<int64_t> topk_idx;
  Matrix<float> topk_weights;
};

inline RandomRank random_rank(std::mt19937& rng, int num_experts, int64_t max_tokens, int64_t topk, int64_t hidden,
                              double p_empty, bool unit_weights) {
  const int64_t num_tokens = std::uniform_int_distribution<int64_t>(0, max_tokens)(rng);
  RandomRank rank;
  rank.x = random_small_bf16(rng, num_tokens, hidden);
  rank.topk_idx = random_topk(rng, num_tokens, topk, num_experts, p_empty);
  rank.topk_weights = unit_weights ? Matrix<float>(num_tokens, topk, 1.0f) : random_weights(rng, num_tokens, topk);
  return rank;
}

}  // namespace epx::ref::testing
