// HT dispatch (DESIGN.md §1.1): the hand-worked routing of ht_fixture.hpp, the worst-case and cached
// forms, FP8 with strided scales, edge shapes and random properties.
#include <gtest/gtest.h>

#include <random>

#include "epx/reference/layout.hpp"
#include "ht_fixture.hpp"

namespace epx::ref {
namespace {

using testing::exact_bf16;
using testing::matrix;

Matrix<uint16_t> bf16_rows(int64_t rows, std::initializer_list<float> values) {
  Matrix<uint16_t> m(rows, static_cast<int64_t>(values.size()) / rows);
  std::size_t i = 0;
  for (float v : values) m.data[i++] = exact_bf16(v);
  return m;
}

TEST(HtDispatch, HandWorkedBf16) {
  const auto tokens = testing::ht_hand_tokens();
  const HtDispatchResult result = ht_dispatch(tokens, ExpertPlacement(4, 2));
  ASSERT_EQ(result.recv.size(), 2u);

  const HtRecv& r0 = result.recv[0];
  EXPECT_EQ(r0.num_recv_tokens, 3);
  EXPECT_EQ(r0.src_idx, (std::vector<int32_t>{0, 1, 1}));
  EXPECT_EQ(r0.x_bf16, bf16_rows(3, {0, 1, 10, 11, 110, 111}));
  EXPECT_EQ(r0.topk_idx, matrix<int64_t>(3, 2, {0, -1, 1, -1, -1, 0}));
  EXPECT_EQ(r0.topk_weights, matrix<float>(3, 2, {0.5f, 0, 0.75f, 0, 0, 0.875f}));
  EXPECT_EQ(r0.num_recv_tokens_per_expert, (std::vector<int32_t>{2, 1}));

  const HtRecv& r1 = result.recv[1];
  EXPECT_EQ(r1.num_recv_tokens, 3);
  EXPECT_EQ(r1.src_idx, (std::vector<int32_t>{0, 0, 1}));
  EXPECT_EQ(r1.x_bf16, bf16_rows(3, {0, 1, 100, 101, 110, 111}));
  EXPECT_EQ(r1.topk_idx, matrix<int64_t>(3, 2, {-1, 1, 0, -1, 1, -1}));
  EXPECT_EQ(r1.topk_weights, matrix<float>(3, 2, {0, 0.25f, 0.6f, 0, 0.125f, 0}));
  EXPECT_EQ(r1.num_recv_tokens_per_expert, (std::vector<int32_t>{1, 2}));

  const HtHandle& handle = result.handle;
  EXPECT_EQ(handle.recv_count, matrix<int32_t>(2, 2, {2, 1, 1, 2}));
  EXPECT_EQ(handle.recv_begin, matrix<int32_t>(2, 2, {0, 2, 0, 1}));
  EXPECT_EQ(handle.num_recv_tokens, (std::vector<int32_t>{3, 3}));
  EXPECT_EQ(handle.send_row[0], matrix<int32_t>(3, 2, {0, 0, 1, -1, -1, -1}));
  EXPECT_EQ(handle.send_row[1], matrix<int32_t>(2, 2, {-1, 1, 2, 2}));
}

TEST(HtDispatch, ExpertCountsAreRoundedUpToTheAlignment) {
  HtDispatchOptions options;
  options.expert_alignment = 2;
  const HtDispatchResult result = ht_dispatch(testing::ht_hand_tokens(), ExpertPlacement(4, 2), options);
  EXPECT_EQ(result.recv[0].num_recv_tokens_per_expert, (std::vector<int32_t>{2, 2}));  // from {2, 1}
  EXPECT_EQ(result.recv[1].num_recv_tokens_per_expert, (std::vector<int32_t>{2, 2}));  // from {1, 2}
  options.expert_alignment = 0;
  EXPECT_THROW(ht_dispatch(testing::ht_hand_tokens(), ExpertPlacement(4, 2), options), std::invalid_argument);
}

TEST(HtDispatch, WorstCaseFormPadsAfterTheExactRows) {
  const auto tokens = testing::ht_hand_tokens();
  const ExpertPlacement placement(4, 2);
  const HtDispatchResult exact = ht_dispatch(tokens, placement);
  HtDispatchOptions options;
  options.num_worst_tokens = 5;
  const HtDispatchResult worst = ht_dispatch(tokens, placement, options);
  EXPECT_EQ(worst.handle, exact.handle);
  for (int r = 0; r < 2; ++r) {
    const HtRecv& w = worst.recv[static_cast<std::size_t>(r)];
    const HtRecv& e = exact.recv[static_cast<std::size_t>(r)];
    EXPECT_EQ(w.num_recv_tokens, 3);
    EXPECT_EQ(w.num_recv_tokens_per_expert, e.num_recv_tokens_per_expert);
    ASSERT_EQ(w.x_bf16.rows, 5);
    for (int64_t row = 0; row < 5; ++row) {
      for (int64_t h = 0; h < 2; ++h) EXPECT_EQ(w.x_bf16.at(row, h), row < 3 ? e.x_bf16.at(row, h) : 0);
      for (int64_t k = 0; k < 2; ++k) {
        EXPECT_EQ(w.topk_idx.at(row, k), row < 3 ? e.topk_idx.at(row, k) : -1);
        EXPECT_EQ(w.topk_weights.at(row, k), row < 3 ? e.topk_weights.at(row, k) : 0.0f);
      }
      EXPECT_EQ(w.src_idx[static_cast<std::size_t>(row)], row < 3 ? e.src_idx[static_cast<std::size_t>(row)] : -1);
    }
  }
  options.num_worst_tokens = 2;  // fewer rows than rank 0 receives
  EXPECT_THROW(ht_dispatch(tokens, placement, options), std::invalid_argument);
}

TEST(HtDispatch, CachedFormEqualsTheExactForm) {
  auto tokens = testing::ht_hand_tokens();
  const ExpertPlacement placement(4, 2);
  const HtDispatchResult exact = ht_dispatch(tokens, placement);
  const HtDispatchResult cached = ht_dispatch_cached(tokens, placement, exact.handle);
  EXPECT_EQ(cached.recv, exact.recv);
  EXPECT_EQ(cached.handle, exact.handle);

  HtDispatchOptions options;
  options.num_worst_tokens = 6;
  EXPECT_EQ(ht_dispatch_cached(tokens, placement, exact.handle, options).recv,
            ht_dispatch(tokens, placement, options).recv);

  // New payload, same routing: rows follow the handle. Token (1, 1) lands in row 2 of both ranks.
  tokens[1].x_bf16.at(1, 0) = exact_bf16(-7.0f);
  const HtDispatchResult again = ht_dispatch_cached(tokens, placement, exact.handle);
  EXPECT_EQ(again.recv[0].x_bf16.at(2, 0), exact_bf16(-7.0f));
  EXPECT_EQ(again.recv[1].x_bf16.at(2, 0), exact_bf16(-7.0f));
}

TEST(HtDispatch, CachedFormRejectsAHandleOfAnotherRouting) {
  auto tokens = testing::ht_hand_tokens();
  const ExpertPlacement placement(4, 2);
  const HtHandle handle = ht_dispatch(tokens, placement).handle;
  tokens[0].topk_idx.at(2, 0) = 2;  // token (0, 2) now goes to rank 1, which the handle does not know
  EXPECT_THROW(ht_dispatch_cached(tokens, placement, handle), std::invalid_argument);
}

// FP8: H = 256, two scale groups. Values and scales encode (rank, token, column/group).
HtTokens fp8_tokens(int rank, Matrix<int64_t> topk_idx, bool column_major_scales) {
  const int64_t num_tokens = topk_idx.rows;
  HtTokens in;
  in.dtype = Dtype::fp8;
  in.x_fp8 = Matrix<uint8_t>(num_tokens, 256);
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t h = 0; h < 256; ++h) in.x_fp8.at(t, h) = static_cast<uint8_t>(16 * rank + 4 * t + h % 4);
  }
  in.x_scales = column_major_scales ? StridedMatrix<float>::column_major(num_tokens, 2)
                                    : StridedMatrix<float>::row_major(num_tokens, 2);
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t g = 0; g < 2; ++g) in.x_scales.at(t, g) = static_cast<float>(100 * rank + 10 * t + g);
  }
  in.topk_weights = Matrix<float>(num_tokens, topk_idx.cols, 1.0f);
  in.topk_idx = std::move(topk_idx);
  return in;
}

TEST(HtDispatch, Fp8ScalesTravelWithTheirTokenWhateverTheirStrides) {
  const ExpertPlacement placement(4, 2);
  std::vector<HtDispatchResult> results;
  for (bool column_major : {false, true}) {
    const std::vector<HtTokens> tokens = {fp8_tokens(0, matrix<int64_t>(3, 2, {0, 3, 1, -1, -1, -1}), column_major),
                                          fp8_tokens(1, matrix<int64_t>(2, 2, {2, -1, 3, 0}), column_major)};
    results.push_back(ht_dispatch(tokens, placement));
  }
  EXPECT_EQ(results[0].recv, results[1].recv);
  // Rank 1 receives (0,0), (1,0), (1,1).
  const HtRecv& r1 = results[1].recv[1];
  EXPECT_EQ(r1.x_scales, matrix<float>(3, 2, {0, 1, 100, 101, 110, 111}));
  EXPECT_EQ(r1.x_fp8.at(1, 0), 16);
  EXPECT_EQ(r1.x_fp8.at(2, 3), 16 + 4 + 3);
  EXPECT_EQ(r1.x_fp8.at(2, 255), 16 + 4 + 3);
  EXPECT_TRUE(r1.x_bf16.data.empty());
}

TEST(HtDispatch, RankWithoutTokens) {
  const ExpertPlacement placement(4, 2);
  const std::vector<HtTokens> tokens = {
      testing::ht_bf16_tokens(0, matrix<int64_t>(1, 2, {2, 3}), matrix<float>(1, 2, {1, 1})),
      testing::ht_bf16_tokens(1, Matrix<int64_t>(0, 2), Matrix<float>(0, 2))};
  const HtDispatchResult result = ht_dispatch(tokens, placement);
  EXPECT_EQ(result.recv[0].num_recv_tokens, 0);
  EXPECT_EQ(result.recv[0].x_bf16.rows, 0);
  EXPECT_EQ(result.recv[0].num_recv_tokens_per_expert, (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(result.recv[1].num_recv_tokens, 1);
  EXPECT_EQ(result.recv[1].topk_idx, matrix<int64_t>(1, 2, {0, 1}));
  EXPECT_EQ(result.handle.send_row[1].rows, 0);
}

TEST(HtDispatch, EveryTokenToEveryRankWithOneExpertPerRank) {
  const ExpertPlacement placement(3, 3);  // E = R
  std::vector<HtTokens> tokens;
  for (int s = 0; s < 3; ++s) {
    tokens.push_back(
        testing::ht_bf16_tokens(s, matrix<int64_t>(2, 3, {2, 1, 0, 0, 1, 2}), matrix<float>(2, 3, {1, 2, 3, 4, 5, 6})));
  }
  const HtDispatchResult result = ht_dispatch(tokens, placement);
  for (int r = 0; r < 3; ++r) {
    const HtRecv& recv = result.recv[static_cast<std::size_t>(r)];
    EXPECT_EQ(recv.src_idx, (std::vector<int32_t>{0, 1, 0, 1, 0, 1}));
    EXPECT_EQ(recv.num_recv_tokens_per_expert, (std::vector<int32_t>{6}));
    for (int64_t row = 0; row < 6; ++row) {
      EXPECT_EQ(recv.x_bf16.at(row, 1), exact_bf16(static_cast<float>(100 * (row / 2) + 10 * (row % 2) + 1)));
      // Token 0's slot for rank r is 2 - r, token 1's is r; weights 1..6 by slot.
      const int64_t slot = row % 2 == 0 ? 2 - r : r;
      for (int64_t k = 0; k < 3; ++k) {
        EXPECT_EQ(recv.topk_idx.at(row, k), k == slot ? 0 : -1);
        EXPECT_EQ(recv.topk_weights.at(row, k), k == slot ? static_cast<float>(3 * (row % 2) + k + 1) : 0.0f);
      }
    }
  }
}

TEST(HtDispatch, InvalidExpertIdThrows) {
  auto tokens = testing::ht_hand_tokens();
  tokens[1].topk_idx.at(0, 1) = 9;
  EXPECT_THROW(ht_dispatch(tokens, ExpertPlacement(4, 2)), std::invalid_argument);
}

// Random routings: rows arrive in (source rank, token) order, carry their source row, and the counts
// agree with the layout of every source rank.
TEST(HtDispatch, RandomRoutingsFollowTheContract) {
  std::mt19937 rng(2024);
  const ExpertPlacement placement(16, 4);
  for (int trial = 0; trial < 10; ++trial) {
    const std::vector<HtTokens> tokens = testing::ht_random_tokens(rng, placement, 40, 4, 8, 0.2);
    std::vector<Layout> layouts;
    for (const HtTokens& in : tokens) layouts.push_back(compute_layout(in.topk_idx, placement));
    const HtDispatchResult result = ht_dispatch(tokens, placement);
    for (int r = 0; r < 4; ++r) {
      const HtRecv& recv = result.recv[static_cast<std::size_t>(r)];
      std::vector<int32_t> per_expert(4, 0);
      int64_t expected_rows = 0;
      for (int s = 0; s < 4; ++s) {
        expected_rows += layouts[static_cast<std::size_t>(s)].num_tokens_per_rank[static_cast<std::size_t>(r)];
        for (int e = 0; e < 4; ++e) {
          per_expert[static_cast<std::size_t>(e)] +=
              layouts[static_cast<std::size_t>(s)].num_tokens_per_expert[static_cast<std::size_t>(4 * r + e)];
        }
      }
      EXPECT_EQ(recv.num_recv_tokens, expected_rows);
      EXPECT_EQ(recv.num_recv_tokens_per_expert, per_expert);
      // Walk the sources in order; each row must be the next token of the current source that goes to r.
      int64_t row = 0;
      for (int s = 0; s < 4; ++s) {
        const HtTokens& in = tokens[static_cast<std::size_t>(s)];
        for (int64_t t = 0; t < in.topk_idx.rows; ++t) {
          if (layouts[static_cast<std::size_t>(s)].is_token_in_rank.at(t, r) == 0) continue;
          ASSERT_LT(row, recv.num_recv_tokens);
          EXPECT_EQ(recv.src_idx[static_cast<std::size_t>(row)], t);
          EXPECT_EQ(result.handle.send_row[static_cast<std::size_t>(s)].at(t, r), row);
          for (int64_t h = 0; h < 8; ++h) EXPECT_EQ(recv.x_bf16.at(row, h), in.x_bf16.at(t, h));
          for (int64_t k = 0; k < 4; ++k) {
            const int64_t e = in.topk_idx.at(t, k);
            const bool local = e >= 4 * r && e < 4 * r + 4;
            EXPECT_EQ(recv.topk_idx.at(row, k), local ? e - 4 * r : -1);
            EXPECT_EQ(recv.topk_weights.at(row, k), local ? in.topk_weights.at(t, k) : 0.0f);
          }
          ++row;
        }
      }
      EXPECT_EQ(row, recv.num_recv_tokens);
    }
  }
}

}  // namespace
}  // namespace epx::ref
