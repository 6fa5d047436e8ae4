// The hand-worked LL routing shared by the LL dispatch and combine tests, and a helper that fills an
// expert output tensor y from a rule (source rank, token, global expert) -> value.
//
// R = 2, E = 4 (experts 0, 1 on rank 0; 2, 3 on rank 1), K = 2, H = 2, T_max = 3, C = R * T_max = 6.
//   rank 0: t0 -> {0, 3} w {0.5, 0.25};  t1 -> {1, 0} w {0.5, 0.25};  t2 -> {2, -1} w {1, 0.9}
//   rank 1: t0 -> {3, 1} w {2, 0.5};     t1 -> {-1, -1}
// x of (rank s, token t, column h) = 100 s + 10 t + h % 8, exact in BF16.
// Canonical rows (source rank, token):
//   rank 0, expert 0: (0,0) (0,1)       expert 1: (0,1) | (1,0)
//   rank 1, expert 2: (0,2)             expert 3: (0,0) | (1,0)
#pragma once

#include <functional>
#include <random>
#include <vector>

#include "epx/reference/ll.hpp"
#include "test_support.hpp"

namespace epx::ref::testing {

inline constexpr int64_t kLlHandMaxTokens = 3;

inline LlTokens ll_tokens(int rank, Matrix<int64_t> topk_idx, Matrix<float> topk_weights, int64_t hidden = 2) {
  LlTokens in;
  in.x = Matrix<uint16_t>(topk_idx.rows, hidden);
  for (int64_t t = 0; t < topk_idx.rows; ++t) {
    for (int64_t h = 0; h < hidden; ++h) in.x.at(t, h) = exact_bf16(static_cast<float>(100 * rank + 10 * t + h % 8));
  }
  in.topk_idx = std::move(topk_idx);
  in.topk_weights = std::move(topk_weights);
  return in;
}

inline std::vector<LlTokens> ll_hand_tokens() {
  return {ll_tokens(0, matrix<int64_t>(3, 2, {0, 3, 1, 0, 2, -1}),
                    matrix<float>(3, 2, {0.5f, 0.25f, 0.5f, 0.25f, 1, 0.9f})),
          ll_tokens(1, matrix<int64_t>(2, 2, {3, 1, -1, -1}), matrix<float>(2, 2, {2, 0.5f, 0.3f, 0.3f}))};
}

// Random inputs for every rank (see random_rank; 20% empty slots).
inline std::vector<LlTokens> ll_random_tokens(std::mt19937& rng, const ExpertPlacement& placement, int64_t max_tokens,
                                              int64_t topk, int64_t hidden, bool unit_weights) {
  std::vector<LlTokens> tokens;
  for (int s = 0; s < placement.num_ranks(); ++s) {
    RandomRank rank = random_rank(rng, placement.num_experts(), max_tokens, topk, hidden, 0.2, unit_weights);
    tokens.push_back({std::move(rank.x), std::move(rank.topk_idx), std::move(rank.topk_weights)});
  }
  return tokens;
}

// y[r] [E_local][C][H]: every column of the row of (s, t) for global expert e holds value(s, t, e).
inline std::vector<Tensor3<uint16_t>> make_y(const std::vector<LlRecv>& recv, int64_t hidden,
                                             const std::function<float(int, int64_t, int64_t)>& value) {
  std::vector<Tensor3<uint16_t>> y;
  const int num_ranks = static_cast<int>(recv.size());
  for (int r = 0; r < num_ranks; ++r) {
    const LlRecv& rr = recv[static_cast<std::size_t>(r)];
    const int64_t num_local = rr.src_idx.rows;
    Tensor3<uint16_t> out(num_local, rr.src_idx.cols, hidden, 0);
    for (int64_t e = 0; e < num_local; ++e) {
      for (int s = 0; s < num_ranks; ++s) {
        const RowRange range = rr.layout_range.at(e, s);
        for (int64_t row = range.begin; row < range.begin + range.count; ++row) {
          const uint16_t v = exact_bf16(value(s, rr.src_idx.at(e, row), r * num_local + e));
          for (int64_t h = 0; h < hidden; ++h) out.at(e, row, h) = v;
        }
      }
    }
    y.push_back(std::move(out));
  }
  return y;
}

}  // namespace epx::ref::testing
