// Dispatch layout (DESIGN.md §1.1): hand-worked routings and random properties.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "epx/reference/layout.hpp"
#include "test_support.hpp"

namespace epx::ref {
namespace {

using testing::matrix;

TEST(ExpertPlacement, MapsExpertsToRanks) {
  const ExpertPlacement placement(8, 4);  // 2 experts per rank
  EXPECT_EQ(placement.experts_per_rank(), 2);
  EXPECT_EQ(placement.rank_of(0), 0);
  EXPECT_EQ(placement.rank_of(5), 2);
  EXPECT_EQ(placement.rank_of(7), 3);
  EXPECT_EQ(placement.local_id(5, 2), 1);
  EXPECT_EQ(placement.local_id(5, 1), -1);
  EXPECT_EQ(placement.local_id(-1, 0), -1);
  EXPECT_THROW(ExpertPlacement(6, 4), std::invalid_argument);
  EXPECT_THROW(ExpertPlacement(4, 0), std::invalid_argument);
}

// R = 2, E = 4: experts 0, 1 on rank 0; 2, 3 on rank 1.
TEST(Layout, HandWorkedWithEmptySlots) {
  const Layout layout = compute_layout(matrix<int64_t>(3, 2,
                                                       {0, 3,      // ranks 0 and 1
                                                        1, -1,     // rank 0
                                                        -1, -1}),  // nowhere
                                       ExpertPlacement(4, 2));
  EXPECT_EQ(layout.num_tokens_per_rank, (std::vector<int32_t>{2, 1}));
  EXPECT_EQ(layout.num_tokens_per_expert, (std::vector<int32_t>{1, 1, 0, 1}));
  EXPECT_EQ(layout.is_token_in_rank, matrix<uint8_t>(3, 2, {1, 1, 1, 0, 0, 0}));
}

TEST(Layout, TokenCountsOncePerRankAndOncePerRepeatedExpert) {
  const Layout layout = compute_layout(matrix<int64_t>(2, 3,
                                                       {0, 1, 0,    // experts 0, 1 (0 twice): rank 0
                                                        2, 2, 3}),  // experts 2, 3: rank 1
                                       ExpertPlacement(4, 2));
  EXPECT_EQ(layout.num_tokens_per_rank, (std::vector<int32_t>{1, 1}));
  EXPECT_EQ(layout.num_tokens_per_expert, (std::vector<int32_t>{1, 1, 1, 1}));
}

TEST(Layout, NoTokens) {
  const Layout layout = compute_layout(Matrix<int64_t>(0, 4), ExpertPlacement(8, 2));
  EXPECT_EQ(layout.num_tokens_per_rank, (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(layout.num_tokens_per_expert, std::vector<int32_t>(8, 0));
  EXPECT_EQ(layout.is_token_in_rank.rows, 0);
}

TEST(Layout, OneHotExpert) {
  const Layout layout = compute_layout(matrix<int64_t>(3, 2, {5, -1, -1, 5, 5, -1}), ExpertPlacement(8, 4));
  EXPECT_EQ(layout.num_tokens_per_rank, (std::vector<int32_t>{0, 0, 3, 0}));
  EXPECT_EQ(layout.num_tokens_per_expert, (std::vector<int32_t>{0, 0, 0, 0, 0, 3, 0, 0}));
}

TEST(Layout, EveryTokenToEveryRank) {
  const Layout layout = compute_layout(matrix<int64_t>(2, 4, {0, 2, 4, 6, 7, 5, 3, 1}), ExpertPlacement(8, 4));
  EXPECT_EQ(layout.num_tokens_per_rank, (std::vector<int32_t>{2, 2, 2, 2}));
  EXPECT_EQ(layout.is_token_in_rank, Matrix<uint8_t>(2, 4, 1));
}

TEST(Layout, OneExpertPerRank) {
  const Layout layout = compute_layout(matrix<int64_t>(2, 2, {2, 0, 2, -1}), ExpertPlacement(3, 3));
  EXPECT_EQ(layout.num_tokens_per_rank, (std::vector<int32_t>{1, 0, 2}));
  EXPECT_EQ(layout.num_tokens_per_expert, (std::vector<int32_t>{1, 0, 2}));
}

TEST(Layout, Int32AndInt64GiveTheSameResult) {
  std::mt19937 rng(11);
  const Matrix<int64_t> wide = testing::random_topk(rng, 50, 4, 16, 0.2);
  Matrix<int32_t> narrow(wide.rows, wide.cols);
  for (std::size_t i = 0; i < wide.data.size(); ++i) narrow.data[i] = static_cast<int32_t>(wide.data[i]);
  const ExpertPlacement placement(16, 4);
  const Layout a = compute_layout(wide, placement);
  const Layout b = compute_layout(narrow, placement);
  EXPECT_EQ(a.num_tokens_per_rank, b.num_tokens_per_rank);
  EXPECT_EQ(a.num_tokens_per_expert, b.num_tokens_per_expert);
  EXPECT_EQ(a.is_token_in_rank, b.is_token_in_rank);
}

TEST(Layout, InvalidExpertIdThrowsNamingTokenSlotAndValue) {
  const ExpertPlacement placement(4, 2);
  try {
    compute_layout(matrix<int64_t>(2, 2, {0, 1, 4, -1}), placement);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("token 1, slot 0: expert id 4"), std::string::npos) << error.what();
  }
  EXPECT_THROW(compute_layout(matrix<int32_t>(1, 2, {0, -2}), placement), std::invalid_argument);
}

// Properties: the per-rank counts are the column sums of is_token_in_rank, and a token is in a rank
// exactly when one of its slots names an expert there.
TEST(Layout, RandomRoutingsAreConsistent) {
  std::mt19937 rng(5);
  const ExpertPlacement placement(32, 8);
  for (int trial = 0; trial < 20; ++trial) {
    const Matrix<int64_t> idx = testing::random_topk(rng, 37, 6, 32, 0.15);
    const Layout layout = compute_layout(idx, placement);
    std::vector<int32_t> column_sums(8, 0);
    int32_t expert_total = 0;
    for (int64_t t = 0; t < idx.rows; ++t) {
      for (int r = 0; r < 8; ++r) {
        bool named = false;
        for (int64_t k = 0; k < idx.cols; ++k) named = named || (idx.at(t, k) / 4 == r && idx.at(t, k) >= 0);
        EXPECT_EQ(layout.is_token_in_rank.at(t, r), named ? 1 : 0);
        column_sums[static_cast<std::size_t>(r)] += named ? 1 : 0;
      }
      for (int64_t k = 0; k < idx.cols; ++k) expert_total += idx.at(t, k) >= 0 ? 1 : 0;
    }
    EXPECT_EQ(layout.num_tokens_per_rank, column_sums);
    int32_t counted = 0;
    for (int32_t c : layout.num_tokens_per_expert) counted += c;
    EXPECT_EQ(counted, expert_total);  // random_topk never repeats an expert
  }
}

}  // namespace
}  // namespace epx::ref
