// The hand-worked HT routing shared by the HT dispatch and combine tests.
//
// R = 2, E = 4 (experts 0, 1 on rank 0; 2, 3 on rank 1), K = 2, H = 2.
//   rank 0: t0 -> experts {0, 3} (ranks 0, 1); t1 -> {1, -1} (rank 0); t2 -> {-1, -1} (nowhere)
//   rank 1: t0 -> {2, -1} (rank 1);            t1 -> {3, 0} (ranks 1, 0)
// x of (rank s, token t, column h) = 100 s + 10 t + h, exact in BF16.
// Received, in (source rank, token) order:
//   rank 0: (0,0) (0,1) (1,1)          rank 1: (0,0) (1,0) (1,1)
#pragma once

#include <random>
#include <vector>

#include "epx/reference/ht.hpp"
#include "test_support.hpp"

namespace epx::ref::testing {

inline HtTokens ht_bf16_tokens(int rank, Matrix<int64_t> topk_idx, Matrix<float> topk_weights) {
  HtTokens in;
  in.dtype = Dtype::bf16;
  in.x_bf16 = Matrix<uint16_t>(topk_idx.rows, 2);
  for (int64_t t = 0; t < topk_idx.rows; ++t) {
    for (int64_t h = 0; h < 2; ++h) in.x_bf16.at(t, h) = exact_bf16(static_cast<float>(100 * rank + 10 * t + h));
  }
  in.topk_idx = std::move(topk_idx);
  in.topk_weights = std::move(topk_weights);
  return in;
}

inline std::vector<HtTokens> ht_hand_tokens() {
  return {ht_bf16_tokens(0, matrix<int64_t>(3, 2, {0, 3, 1, -1, -1, -1}),
                         matrix<float>(3, 2, {0.5f, 0.25f, 0.75f, 0.1f, 0.3f, 0.4f})),
          ht_bf16_tokens(1, matrix<int64_t>(2, 2, {2, -1, 3, 0}), matrix<float>(2, 2, {0.6f, 0.7f, 0.125f, 0.875f}))};
}

// Random BF16 inputs for every rank (see random_rank).
inline std::vector<HtTokens> ht_random_tokens(std::mt19937& rng, const ExpertPlacement& placement, int64_t max_tokens,
                                              int64_t topk, int64_t hidden, double p_empty) {
  std::vector<HtTokens> tokens;
  for (int s = 0; s < placement.num_ranks(); ++s) {
    RandomRank rank = random_rank(rng, placement.num_experts(), max_tokens, topk, hidden, p_empty, false);
    tokens.push_back({Dtype::bf16, std::move(rank.x), {}, {}, std::move(rank.topk_idx), std::move(rank.topk_weights)});
  }
  return tokens;
}

}  // namespace epx::ref::testing
