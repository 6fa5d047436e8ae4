// Deterministic inputs for the GPU tests: every rank can rebuild every other rank's inputs from
// (case seed, rank), so each rank checks its own outputs against the CPU reference of the whole team.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "epx/reference/numeric.hpp"
#include "epx/reference/routing.hpp"
#include "epx/reference/tensor.hpp"

namespace epx::test {

// A case's expert count meaning "one expert per rank, whatever the team size".
inline constexpr int kExpertsEqualRanks = 0;

enum class Routing { uniform, zipf, one_hot };

inline const char* to_string(Routing r) {
  switch (r) {
    case Routing::uniform:
      return "uniform";
    case Routing::zipf:
      return "zipf";
    case Routing::one_hot:
      return "one_hot";
  }
  return "?";
}

// topk_idx [T][K]: K distinct experts per token drawn by `routing`, then each slot -1 with probability
// `p_empty`. one_hot: every token's first slot is expert 0 (the hot one), the rest uniform.
inline ref::Matrix<int64_t> make_topk_idx(std::mt19937& rng, int T, int K, int E, Routing routing, double p_empty) {
  ref::Matrix<int64_t> idx(T, K, -1);
  std::vector<double> weight(E, 1.0);
  if (routing == Routing::zipf) {
    for (int e = 0; e < E; ++e) weight[e] = 1.0 / std::pow(e + 1.0, 1.2);
  }
  std::discrete_distribution<int> pick(weight.begin(), weight.end());
  std::bernoulli_distribution empty(p_empty);
  for (int t = 0; t < T; ++t) {
    std::vector<int64_t> chosen;
    if (routing == Routing::one_hot) chosen.push_back(0);
    while (int(chosen.size()) < std::min(K, E)) {
      const int64_t e = pick(rng);
      if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
    }
    for (int k = 0; k < int(chosen.size()); ++k) idx.at(t, k) = empty(rng) ? -1 : chosen[k];
  }
  return idx;
}

// Random BF16 bits of moderate magnitude (never all zero), uniform in [-4, 4).
// Two values from each 32-bit draw (ref::random_bf16 reads 15 bits): the HT cases at 8 ranks draw a
// billion of them on every rank.
inline ref::Matrix<uint16_t> make_bf16(std::mt19937& rng, int64_t rows, int64_t cols) {
  ref::Matrix<uint16_t> m(rows, cols);
  for (std::size_t i = 0; i < m.data.size(); i += 2) {
    const uint32_t bits = rng();
    m.data[i] = ref::random_bf16(bits);
    if (i + 1 < m.data.size()) m.data[i + 1] = ref::random_bf16(bits >> 16);
  }
  return m;
}

inline ref::Matrix<float> make_floats(std::mt19937& rng, int64_t rows, int64_t cols, float lo, float hi) {
  ref::Matrix<float> m(rows, cols);
  std::uniform_real_distribution<float> value(lo, hi);
  for (auto& v : m.data) v = value(rng);
  return m;
}

inline std::mt19937 rank_rng(uint32_t case_seed, int rank, uint32_t stream) {
  std::seed_seq seq{case_seed, uint32_t(rank), stream};
  return std::mt19937(seq);
}

}  // namespace epx::test
