// HT combine (DESIGN.md §1.1): hand-worked sums, the exact summation order, bias, weights, and the
// round trip combine(dispatch(x)).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "epx/reference/layout.hpp"
#include "ht_fixture.hpp"

namespace epx::ref {
namespace {

using testing::bf16_value;
using testing::exact_bf16;
using testing::matrix;

// constant_rows(values, hidden): row i holds values[i] in every column.
Matrix<uint16_t> constant_rows(std::initializer_list<float> values, int64_t hidden) {
  return testing::constant_rows(hidden, values);
}

// Rank 0 received (0,0) (0,1) (1,1); rank 1 received (0,0) (1,0) (1,1) (see ht_fixture.hpp).
TEST(HtCombine, HandWorkedSums) {
  const HtHandle handle = ht_dispatch(testing::ht_hand_tokens(), ExpertPlacement(4, 2)).handle;
  const std::vector<HtCombineInput> y = {{constant_rows({1, 2, 4}, 2), {}}, {constant_rows({8, 16, 32}, 2), {}}};
  const auto out = ht_combine(y, handle);
  EXPECT_EQ(out[0].x, constant_rows({1 + 8, 2, 0}, 2));  // token (0,2) went nowhere: 0
  EXPECT_EQ(out[1].x, constant_rows({16, 4 + 32}, 2));
  EXPECT_EQ(out[0].topk_weights.cols, 0);

  const std::vector<Matrix<uint16_t>> bias = {constant_rows({0.5f, 0.5f, 0.5f}, 2), constant_rows({0.5f, 0.5f}, 2)};
  const auto biased = ht_combine(y, handle, bias);
  EXPECT_EQ(biased[0].x, constant_rows({9.5f, 2.5f, 0.5f}, 2));
  EXPECT_EQ(biased[1].x, constant_rows({16.5f, 36.5f}, 2));

  const std::vector<Matrix<uint16_t>> second = {constant_rows({0.25f, 0.25f, 0.25f}, 2),
                                                constant_rows({0.25f, 0.25f}, 2)};
  const auto both = ht_combine(y, handle, bias, second);
  EXPECT_EQ(both[0].x, constant_rows({9.75f, 2.75f, 0.75f}, 2));
  EXPECT_EQ(both[1].x, constant_rows({16.75f, 36.75f}, 2));
  EXPECT_EQ(ht_combine(y, handle, {}, second)[1].x, constant_rows({16.25f, 36.25f}, 2));
}

TEST(HtCombine, WeightsSumBackToTheRouterWeights) {
  const auto tokens = testing::ht_hand_tokens();
  const HtDispatchResult dispatched = ht_dispatch(tokens, ExpertPlacement(4, 2));
  std::vector<HtCombineInput> y;
  for (const HtRecv& recv : dispatched.recv) y.push_back({recv.x_bf16, recv.topk_weights});
  const auto out = ht_combine(y, dispatched.handle);
  // Each slot's weight comes back from the one rank holding its expert; -1 slots give 0.
  EXPECT_EQ(out[0].topk_weights, matrix<float>(3, 2, {0.5f, 0.25f, 0.75f, 0, 0, 0}));
  EXPECT_EQ(out[1].topk_weights, matrix<float>(2, 2, {0.6f, 0, 0.125f, 0.875f}));
}

// One token on rank 0 with one expert on each of three ranks (E = R = 3).
HtHandle one_token_to_three_ranks() {
  std::vector<TopkIdx> topk = {matrix<int64_t>(1, 3, {0, 1, 2}), Matrix<int64_t>(0, 3), Matrix<int64_t>(0, 3)};
  return ht_make_handle(topk, ExpertPlacement(3, 3));
}

TEST(HtCombine, AccumulatesInFloatAndRoundsOnce) {
  const HtHandle handle = one_token_to_three_ranks();
  // 256 + 1 + 1 = 258 in float. Rounding to BF16 after each add would give 256 (257 ties to 256).
  const std::vector<HtCombineInput> y = {
      {constant_rows({256}, 1), {}}, {constant_rows({1}, 1), {}}, {constant_rows({1}, 1), {}}};
  EXPECT_EQ(bf16_value(ht_combine(y, handle)[0].x.at(0, 0)), 258.0f);
}

TEST(HtCombine, SumsRanksInAscendingOrderThenTheBiases) {
  const HtHandle handle = one_token_to_three_ranks();
  const float big = std::ldexp(1.0f, 30);
  // (2^30 + -2^30) + 1 = 1, whereas 2^30 + (-2^30 + 1) = 0 in float.
  const std::vector<HtCombineInput> y = {
      {constant_rows({big}, 1), {}}, {constant_rows({-big}, 1), {}}, {constant_rows({1}, 1), {}}};
  EXPECT_EQ(bf16_value(ht_combine(y, handle)[0].x.at(0, 0)), 1.0f);
  // The bias comes last: (2^30 + -2^30 + 0) + 1 = 1; bias first would give (1 + 2^30) - 2^30 = 0.
  const std::vector<HtCombineInput> y2 = {
      {constant_rows({big}, 1), {}}, {constant_rows({-big}, 1), {}}, {constant_rows({0}, 1), {}}};
  const std::vector<Matrix<uint16_t>> bias = {constant_rows({1}, 1), Matrix<uint16_t>(0, 1), Matrix<uint16_t>(0, 1)};
  EXPECT_EQ(bf16_value(ht_combine(y2, handle, bias)[0].x.at(0, 0)), 1.0f);
  // The second bias after the first: (2^30 + -2^30) + 1 = 1; the other way, (2^30 + 1) + -2^30 = 0.
  const std::vector<HtCombineInput> y3 = {
      {constant_rows({big}, 1), {}}, {constant_rows({0}, 1), {}}, {constant_rows({0}, 1), {}}};
  const std::vector<Matrix<uint16_t>> minus_big = {constant_rows({-big}, 1), Matrix<uint16_t>(0, 1),
                                                   Matrix<uint16_t>(0, 1)};
  EXPECT_EQ(bf16_value(ht_combine(y3, handle, minus_big, bias)[0].x.at(0, 0)), 1.0f);
  EXPECT_EQ(bf16_value(ht_combine(y3, handle, bias, minus_big)[0].x.at(0, 0)), 0.0f);
}

TEST(HtCombine, AcceptsWorstCasePaddingRowsAndRejectsShortInputsAndBiases) {
  const auto tokens = testing::ht_hand_tokens();
  const HtHandle handle = ht_dispatch(tokens, ExpertPlacement(4, 2)).handle;
  const std::vector<HtCombineInput> padded = {{constant_rows({1, 2, 4, 99, 99}, 2), {}},
                                              {constant_rows({8, 16, 32, 99, 99}, 2), {}}};
  EXPECT_EQ(ht_combine(padded, handle)[1].x, constant_rows({16, 36}, 2));
  const std::vector<HtCombineInput> short_y = {{constant_rows({1, 2}, 2), {}}, {constant_rows({8, 16, 32}, 2), {}}};
  EXPECT_THROW(ht_combine(short_y, handle), std::invalid_argument);
  const std::vector<Matrix<uint16_t>> short_bias = {constant_rows({1, 1, 1}, 2), constant_rows({1}, 2)};
  EXPECT_THROW(ht_combine(padded, handle, {}, short_bias), std::invalid_argument);
}

// combine(dispatch(x)) with y = recv_x returns x times the number of ranks the token went to.
// The values have 5 significant bits, so x * n (n <= 4) is exact in BF16 and the check is exact.
TEST(HtCombine, RoundTripMultipliesByTheNumberOfRanks) {
  std::mt19937 rng(99);
  const ExpertPlacement placement(16, 4);
  for (int trial = 0; trial < 10; ++trial) {
    const std::vector<HtTokens> tokens = testing::ht_random_tokens(rng, placement, 30, 6, 16, 0.25);
    HtDispatchOptions options;
    options.num_worst_tokens = 4 * 30;
    const HtDispatchResult dispatched = ht_dispatch(tokens, placement, options);
    std::vector<HtCombineInput> y;
    for (const HtRecv& recv : dispatched.recv) y.push_back({recv.x_bf16, {}});
    const auto out = ht_combine(y, dispatched.handle);
    for (int s = 0; s < 4; ++s) {
      const HtTokens& in = tokens[static_cast<std::size_t>(s)];
      const Layout layout = compute_layout(in.topk_idx, placement);
      for (int64_t t = 0; t < in.topk_idx.rows; ++t) {
        int ranks = 0;
        for (int r = 0; r < 4; ++r) ranks += layout.is_token_in_rank.at(t, r);
        for (int64_t h = 0; h < 16; ++h) {
          ASSERT_EQ(bf16_value(out[static_cast<std::size_t>(s)].x.at(t, h)),
                    bf16_value(in.x_bf16.at(t, h)) * static_cast<float>(ranks))
              << "rank " << s << " token " << t << " column " << h;
        }
      }
    }
  }
}

}  // namespace
}  // namespace epx::ref
