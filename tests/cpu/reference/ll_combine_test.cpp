// LL combine (DESIGN.md §1.2, §1.3): the naive fmaf chain, the local (per destination rank) order,
// hand-worked values that tell the two apart, and random properties.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>

#include "epx/reference/numeric.hpp"
#include "ll_fixture.hpp"

namespace epx::ref {
namespace {

using testing::bf16_value;
using testing::exact_bf16;
using testing::kLlHandMaxTokens;
using testing::matrix;

std::vector<TopkIdx> topk_of(const std::vector<LlTokens>& tokens) {
  std::vector<TopkIdx> out;
  for (const LlTokens& in : tokens) out.push_back(in.topk_idx);
  return out;
}

std::vector<Matrix<float>> weights_of(const std::vector<LlTokens>& tokens) {
  std::vector<Matrix<float>> out;
  for (const LlTokens& in : tokens) out.push_back(in.topk_weights);
  return out;
}

std::vector<Matrix<uint16_t>> combine(const std::vector<LlTokens>& tokens, const std::vector<LlRecv>& recv,
                                      const std::vector<Tensor3<uint16_t>>& y, const ExpertPlacement& placement,
                                      LlCombineOrder order) {
  return ll_combine(y, recv, topk_of(tokens), weights_of(tokens), placement, order);
}

// Expert outputs of the hand routing: expert 0 -> 2 (0,0), 4 (0,1); expert 1 -> 8 (0,1), 16 (1,0);
// expert 2 -> 32 (0,2); expert 3 -> 64 (0,0), 128 (1,0).
float hand_expert_output(int s, int64_t t, int64_t e) {
  if (e == 0) return t == 0 ? 2.0f : 4.0f;
  if (e == 1) return s == 0 ? 8.0f : 16.0f;
  if (e == 2) return 32.0f;
  return s == 0 ? 64.0f : 128.0f;
}

TEST(LlCombine, HandWorkedBothOrders) {
  const auto tokens = testing::ll_hand_tokens();
  const ExpertPlacement placement(4, 2);
  const auto recv = ll_dispatch(tokens, placement, kLlHandMaxTokens);
  const auto y = testing::make_y(recv, 2, hand_expert_output);
  for (LlCombineOrder order : {LlCombineOrder::naive, LlCombineOrder::local}) {
    const auto out = combine(tokens, recv, y, placement, order);
    EXPECT_EQ(out[0], testing::constant_rows(2, {0.5f * 2 + 0.25f * 64,  // 17
                                                 0.5f * 8 + 0.25f * 4,   // 5
                                                 1.0f * 32}));
    EXPECT_EQ(out[1], testing::constant_rows(2, {2.0f * 128 + 0.5f * 16,  // 264
                                                 0}));                    // no expert: 0
  }
  const auto partials = ll_local_partials(y, recv, topk_of(tokens), weights_of(tokens), placement);
  EXPECT_EQ(partials[0].at(0, 0, 0), exact_bf16(1));   // token (0,0) on rank 0: 0.5 * 2
  EXPECT_EQ(partials[0].at(0, 1, 1), exact_bf16(16));  // on rank 1: 0.25 * 64
  EXPECT_EQ(partials[0].at(1, 0, 0), exact_bf16(5));
  EXPECT_EQ(partials[0].at(1, 1, 0), 0);  // token (0,1) does not go to rank 1
  EXPECT_EQ(partials[1].at(0, 0, 0), exact_bf16(8));
  EXPECT_EQ(partials[1].at(0, 1, 0), exact_bf16(256));
}

// R = 2, E = 4, one rank with tokens, y given per (token, expert); returns (naive, local) for H = 1.
std::pair<uint16_t, uint16_t> one_token(Matrix<int64_t> topk_idx, Matrix<float> topk_weights,
                                        float (*value)(int, int64_t, int64_t)) {
  const ExpertPlacement placement(4, 2);
  const std::vector<LlTokens> tokens = {testing::ll_tokens(0, std::move(topk_idx), std::move(topk_weights), 1),
                                        testing::ll_tokens(1, Matrix<int64_t>(0, 3), Matrix<float>(0, 3), 1)};
  const auto recv = ll_dispatch(tokens, placement, 1);
  const auto y = testing::make_y(recv, 1, value);
  return {combine(tokens, recv, y, placement, LlCombineOrder::naive)[0].at(0, 0),
          combine(tokens, recv, y, placement, LlCombineOrder::local)[0].at(0, 0)};
}

// w = 1 + 2^-12 + 2^-23 and y = +-(1 + 2^-7): the exact product p has a 2^-30 term that float drops.
// Naive: acc = fmaf(w, -y, 0) = -round(p); then fmaf(w, y, acc) = p - round(p) = 2^-30 (BF16 0x3080).
// A separate multiply and add would give 0. Local with the two experts on different ranks rounds
// each partial to BF16 first: -(1 + 2^-7) + (1 + 2^-7) = 0.
TEST(LlCombine, NaiveIsExactlyTheFmafChain) {
  const float w = 1.0f + std::ldexp(1.0f, -12) + std::ldexp(1.0f, -23);
  const auto value = [](int, int64_t, int64_t e) { return e == 0 ? -(1.0f + 0.0078125f) : 1.0f + 0.0078125f; };
  const auto same_rank = one_token(matrix<int64_t>(1, 3, {0, 1, -1}), matrix<float>(1, 3, {w, w, 0}), value);
  EXPECT_EQ(same_rank.first, 0x3080);   // 2^-30
  EXPECT_EQ(same_rank.second, 0x3080);  // both slots in one partial: the same chain
  const auto two_ranks = one_token(matrix<int64_t>(1, 3, {0, 2, -1}), matrix<float>(1, 3, {w, w, 0}), value);
  EXPECT_EQ(two_ranks.first, 0x3080);
  EXPECT_EQ(two_ranks.second, 0x0000);
}

// Slots: expert 0 (rank 0) y = 1, expert 2 (rank 1) y = 2^-8, expert 1 (rank 0) y = 2^-8, weights 1.
// Naive: 1 + 2^-8 + 2^-8 = 1 + 2^-7 (0x3F81). Local: partial_0 = bf16(1 + 2^-8) = 1 (tie to even),
// partial_1 = 2^-8, out = bf16(1 + 2^-8) = 1 (0x3F80).
TEST(LlCombine, LocalOrderRoundsPartialsPerRank) {
  const auto value = [](int, int64_t, int64_t e) { return e == 0 ? 1.0f : 0.00390625f; };
  const auto result = one_token(matrix<int64_t>(1, 3, {0, 2, 1}), matrix<float>(1, 3, {1, 1, 1}), value);
  EXPECT_EQ(result.first, 0x3F81);
  EXPECT_EQ(result.second, 0x3F80);
}

TEST(LlCombine, RepeatedExpertUsesItsRowForBothSlots) {
  const auto value = [](int, int64_t, int64_t) { return 4.0f; };
  const auto result = one_token(matrix<int64_t>(1, 3, {1, 1, -1}), matrix<float>(1, 3, {0.5f, 0.25f, 0}), value);
  EXPECT_EQ(result.first, exact_bf16(3));  // 0.5 * 4 + 0.25 * 4
  EXPECT_EQ(result.second, exact_bf16(3));
}

struct RandomCase {
  std::vector<LlTokens> tokens;
  std::vector<LlRecv> recv;
};

RandomCase random_case(std::mt19937& rng, const ExpertPlacement& placement, int64_t max_tokens, int64_t topk,
                       int64_t hidden, bool unit_weights) {
  RandomCase c;
  c.tokens = testing::ll_random_tokens(rng, placement, max_tokens, topk, hidden, unit_weights);
  c.recv = ll_dispatch(c.tokens, placement, max_tokens);
  return c;
}

std::vector<Tensor3<uint16_t>> recv_x(const std::vector<LlRecv>& recv) {
  std::vector<Tensor3<uint16_t>> y;
  for (const LlRecv& r : recv) y.push_back(r.x_bf16);
  return y;
}

// With unit weights and y = recv_x, both orders return x times the number of non-empty slots. Values
// have 5 significant bits and K <= 6, so every partial sum is exact and the check is exact.
TEST(LlCombine, RoundTripWithUnitWeightsCountsTheSlots) {
  std::mt19937 rng(404);
  const ExpertPlacement placement(16, 4);
  for (int trial = 0; trial < 8; ++trial) {
    const RandomCase c = random_case(rng, placement, 10, 6, 8, true);
    for (LlCombineOrder order : {LlCombineOrder::naive, LlCombineOrder::local}) {
      const auto out = combine(c.tokens, c.recv, recv_x(c.recv), placement, order);
      for (std::size_t s = 0; s < c.tokens.size(); ++s) {
        const LlTokens& in = c.tokens[s];
        for (int64_t t = 0; t < in.x.rows; ++t) {
          int slots = 0;
          for (int64_t k = 0; k < in.topk_idx.cols; ++k) slots += in.topk_idx.at(t, k) != -1;
          for (int64_t h = 0; h < in.x.cols; ++h) {
            ASSERT_EQ(bf16_value(out[s].at(t, h)), bf16_value(in.x.at(t, h)) * static_cast<float>(slots));
          }
        }
      }
    }
  }
}

// Random weights and expert outputs: naive equals the BF16 rounding of an fmaf chain written out here
// from the contract, and local stays within BF16 rounding of naive: |local - naive| <= 2^-7 * sum_k |w_k y_k|.
TEST(LlCombine, RandomNaiveIsTheChainAndLocalIsClose) {
  std::mt19937 rng(505);
  const ExpertPlacement placement(8, 4);
  for (int trial = 0; trial < 8; ++trial) {
    const RandomCase c = random_case(rng, placement, 8, 4, 8, false);
    std::vector<Tensor3<uint16_t>> y = recv_x(c.recv);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (Tensor3<uint16_t>& yr : y) {
      for (uint16_t& v : yr.data) v = static_cast<uint16_t>(std::bit_cast<uint32_t>(dist(rng)) >> 16);
    }
    const auto naive = combine(c.tokens, c.recv, y, placement, LlCombineOrder::naive);
    const auto local = combine(c.tokens, c.recv, y, placement, LlCombineOrder::local);
    for (int s = 0; s < 4; ++s) {
      const LlTokens& in = c.tokens[static_cast<std::size_t>(s)];
      for (int64_t t = 0; t < in.x.rows; ++t) {
        for (int64_t h = 0; h < in.x.cols; ++h) {
          float chain = 0.0f;
          float magnitude = 0.0f;
          for (int64_t k = 0; k < in.topk_idx.cols; ++k) {
            const int64_t e = in.topk_idx.at(t, k);
            if (e == -1) continue;
            const LlRecv& r = c.recv[static_cast<std::size_t>(e / 2)];
            const int64_t row = ll_find_row(r, e % 2, s, t);
            const float yv = bf16_value(y[static_cast<std::size_t>(e / 2)].at(e % 2, row, h));
            chain = std::fmaf(in.topk_weights.at(t, k), yv, chain);
            magnitude += std::fabs(in.topk_weights.at(t, k) * yv);
          }
          const uint16_t got = naive[static_cast<std::size_t>(s)].at(t, h);
          EXPECT_EQ(got, float_to_bf16(chain)) << s << "," << t << "," << h;
          const float diff = bf16_value(local[static_cast<std::size_t>(s)].at(t, h)) - bf16_value(got);
          EXPECT_LE(std::fabs(diff), magnitude * 0.0078125f + 1e-30f) << s << "," << t << "," << h;
        }
      }
    }
  }
}

TEST(LlCombine, RejectsYOfAnotherShape) {
  const auto tokens = testing::ll_hand_tokens();
  const ExpertPlacement placement(4, 2);
  const auto recv = ll_dispatch(tokens, placement, kLlHandMaxTokens);
  std::vector<Tensor3<uint16_t>> y = {Tensor3<uint16_t>(2, 5, 2), Tensor3<uint16_t>(2, 6, 2)};  // C must be 6
  EXPECT_THROW(combine(tokens, recv, y, placement, LlCombineOrder::naive), std::invalid_argument);
}

}  // namespace
}  // namespace epx::ref
