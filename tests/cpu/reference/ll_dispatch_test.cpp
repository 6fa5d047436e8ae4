// LL dispatch (DESIGN.md §1.2, §1.3): dedup messages, the packed layout, FP8/UE8M0 payloads,
// canonicalisation and random properties.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "epx/reference/fp8_cast.hpp"
#include "epx/reference/layout.hpp"
#include "epx/reference/numeric.hpp"
#include "ll_fixture.hpp"

namespace epx::ref {
namespace {

using testing::exact_bf16;
using testing::kLlHandMaxTokens;
using testing::matrix;

std::vector<int32_t> first_rows(const Matrix<int32_t>& src_idx, int64_t e, int64_t n) {
  std::vector<int32_t> rows;
  for (int64_t row = 0; row < n; ++row) rows.push_back(src_idx.at(e, row));
  return rows;
}

TEST(LlMessages, OnePerTokenAndDestinationInSlotOrder) {
  const auto tokens = testing::ll_hand_tokens();
  const ExpertPlacement placement(4, 2);
  const std::vector<LlMessage> expected0 = {{0, 0, 0, {{0, 0.5f}}},
                                            {0, 0, 1, {{1, 0.25f}}},
                                            {0, 1, 0, {{1, 0.5f}, {0, 0.25f}}},  // slot order, not expert order
                                            {0, 2, 1, {{0, 1.0f}}}};
  EXPECT_EQ(ll_messages(tokens[0].topk_idx, tokens[0].topk_weights, 0, placement), expected0);
  const std::vector<LlMessage> expected1 = {{1, 0, 0, {{1, 0.5f}}}, {1, 0, 1, {{1, 2.0f}}}};
  EXPECT_EQ(ll_messages(tokens[1].topk_idx, tokens[1].topk_weights, 1, placement), expected1);
}

TEST(LlDispatch, HandWorkedBf16) {
  const auto recv = ll_dispatch(testing::ll_hand_tokens(), ExpertPlacement(4, 2), kLlHandMaxTokens);
  ASSERT_EQ(recv.size(), 2u);
  const LlRecv& r0 = recv[0];
  EXPECT_EQ(r0.recv_count, (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(first_rows(r0.src_idx, 0, 3), (std::vector<int32_t>{0, 1, -1}));
  EXPECT_EQ(first_rows(r0.src_idx, 1, 3), (std::vector<int32_t>{1, 0, -1}));
  EXPECT_EQ(r0.layout_range, matrix<RowRange>(2, 2, {{0, 2}, {2, 0}, {0, 1}, {1, 1}}));
  EXPECT_EQ(r0.x_bf16.dim1, 6);
  EXPECT_EQ(r0.x_bf16.at(0, 1, 1), exact_bf16(11));   // expert 0, row 1 = (0,1)
  EXPECT_EQ(r0.x_bf16.at(1, 1, 0), exact_bf16(100));  // expert 1, row 1 = (1,0)
  EXPECT_EQ(r0.x_bf16.at(1, 2, 0), 0);                // past recv_count

  const LlRecv& r1 = recv[1];
  EXPECT_EQ(r1.recv_count, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(first_rows(r1.src_idx, 0, 2), (std::vector<int32_t>{2, -1}));
  EXPECT_EQ(first_rows(r1.src_idx, 1, 3), (std::vector<int32_t>{0, 0, -1}));
  EXPECT_EQ(r1.layout_range, matrix<RowRange>(2, 2, {{0, 1}, {1, 0}, {0, 1}, {1, 1}}));
  EXPECT_EQ(r1.x_bf16.at(0, 0, 1), exact_bf16(21));
  EXPECT_EQ(r1.x_bf16.at(1, 0, 0), exact_bf16(0));
  EXPECT_EQ(r1.x_bf16.at(1, 1, 1), exact_bf16(101));
  EXPECT_TRUE(r1.x_fp8.data.empty());
}

TEST(LlDispatch, RepeatedExpertGetsOneRowAndKeepsBothSlotsInTheMessage) {
  const ExpertPlacement placement(2, 1);
  const std::vector<LlTokens> tokens = {
      testing::ll_tokens(0, matrix<int64_t>(1, 3, {1, 1, 0}), matrix<float>(1, 3, {0.5f, 0.25f, 1}))};
  const auto recv = ll_dispatch(tokens, placement, 1);
  EXPECT_EQ(recv[0].recv_count, (std::vector<int32_t>{1, 1}));
  const std::vector<LlMessage> expected = {{0, 0, 0, {{1, 0.5f}, {1, 0.25f}, {0, 1.0f}}}};
  EXPECT_EQ(ll_messages(tokens[0].topk_idx, tokens[0].topk_weights, 0, placement), expected);
}

TEST(LlDispatch, NoTokensAnywhere) {
  const std::vector<LlTokens> tokens = {testing::ll_tokens(0, Matrix<int64_t>(0, 2), Matrix<float>(0, 2)),
                                        testing::ll_tokens(1, Matrix<int64_t>(0, 2), Matrix<float>(0, 2))};
  const auto recv = ll_dispatch(tokens, ExpertPlacement(4, 2), 4);
  for (const LlRecv& r : recv) {
    EXPECT_EQ(r.recv_count, (std::vector<int32_t>{0, 0}));
    EXPECT_EQ(r.src_idx, Matrix<int32_t>(2, 8, -1));
    EXPECT_EQ(r.layout_range, Matrix<RowRange>(2, 2));
  }
}

TEST(LlDispatch, OneHotExpertFillsItsRowsAndRejectsTooManyTokens) {
  const ExpertPlacement placement(4, 2);
  const std::vector<LlTokens> tokens = {testing::ll_tokens(0, matrix<int64_t>(2, 1, {3, 3}), Matrix<float>(2, 1, 1)),
                                        testing::ll_tokens(1, matrix<int64_t>(2, 1, {3, 3}), Matrix<float>(2, 1, 1))};
  const auto recv = ll_dispatch(tokens, placement, 2);  // T = T_max: expert 3 gets all C = 4 rows
  EXPECT_EQ(recv[1].recv_count, (std::vector<int32_t>{0, 4}));
  EXPECT_EQ(first_rows(recv[1].src_idx, 1, 4), (std::vector<int32_t>{0, 1, 0, 1}));
  EXPECT_EQ(recv[1].layout_range.at(1, 1), (RowRange{2, 2}));
  EXPECT_EQ(recv[0].recv_count, (std::vector<int32_t>{0, 0}));
  EXPECT_THROW(ll_dispatch(tokens, placement, 1), std::invalid_argument);
}

TEST(LlDispatch, Fp8RowsCarryThePerTokenCast) {
  const ExpertPlacement placement(2, 2);  // E = R: one expert per rank
  // Token (0,0): group 0 has amax 1792 (scale 4), x[0][1] = 4 -> 0x38; other groups are zero.
  LlTokens in = testing::ll_tokens(0, matrix<int64_t>(1, 2, {0, 1}), Matrix<float>(1, 2, 1), 512);
  for (uint16_t& v : in.x.data) v = 0;
  in.x.at(0, 0) = exact_bf16(1792);
  in.x.at(0, 1) = exact_bf16(4);
  const std::vector<LlTokens> tokens = {in, testing::ll_tokens(1, Matrix<int64_t>(0, 2), Matrix<float>(0, 2), 512)};

  LlDispatchOptions options;
  options.use_fp8 = true;
  const auto recv = ll_dispatch(tokens, placement, 1, options);
  for (const LlRecv& r : recv) {
    EXPECT_EQ(r.x_fp8.at(0, 0, 0), 0x7E);
    EXPECT_EQ(r.x_fp8.at(0, 0, 1), 0x38);
    EXPECT_EQ(r.x_scales.at(0, 0, 0), 4.0f);
    EXPECT_EQ(r.x_scales.at(0, 0, 3), 1e-4f / 448.0f);
    EXPECT_EQ(r.x_scales.dim2, 4);
    EXPECT_TRUE(r.x_scales_ue8m0.data.empty());
  }

  options.round_scale = true;
  options.use_ue8m0 = true;
  const auto packed = ll_dispatch(tokens, placement, 1, options);
  // Exponent bytes: 4 -> 129 (0x81), floored groups 2^-22 -> 105 (0x69).
  EXPECT_EQ(static_cast<uint32_t>(packed[1].x_scales_ue8m0.at(0, 0, 0)), 0x69696981u);
  EXPECT_TRUE(packed[1].x_scales.data.empty());

  options.round_scale = false;  // UE8M0 needs power-of-two scales
  EXPECT_THROW(ll_dispatch(tokens, placement, 1, options), std::invalid_argument);
}

// A GPU may order blocks and rows freely; canonicalize must restore the reference's order.
TEST(LlCanonicalize, AcceptsPermutedBlocksAndRows) {
  const auto recv = ll_dispatch(testing::ll_hand_tokens(), ExpertPlacement(4, 2), kLlHandMaxTokens);
  LlRecv gpu = recv[0];
  // Expert 1 held (0,1) | (1,0): put source rank 1's block first and leave garbage past the count.
  gpu.src_idx.at(1, 0) = 0;
  gpu.src_idx.at(1, 1) = 1;
  gpu.src_idx.at(1, 2) = 77;
  gpu.layout_range.at(1, 0) = RowRange{1, 1};
  gpu.layout_range.at(1, 1) = RowRange{0, 1};
  for (int64_t h = 0; h < 2; ++h) {
    std::swap(gpu.x_bf16.at(1, 0, h), gpu.x_bf16.at(1, 1, h));
    gpu.x_bf16.at(1, 2, h) = 0x1234;
  }
  // Expert 0 held (0,0) (0,1): swap the rows inside the block; a zero-count range may start anywhere.
  gpu.src_idx.at(0, 0) = 1;
  gpu.src_idx.at(0, 1) = 0;
  for (int64_t h = 0; h < 2; ++h) std::swap(gpu.x_bf16.at(0, 0, h), gpu.x_bf16.at(0, 1, h));
  gpu.layout_range.at(0, 1) = RowRange{5, 0};
  ASSERT_NE(gpu, recv[0]);
  EXPECT_EQ(ll_canonicalize(gpu), recv[0]);
  EXPECT_EQ(ll_canonicalize(recv[1]), recv[1]);
}

// epx's own order on rank 0 of 2 (ll.hpp): source 1's block first.
TEST(LlCanonicalize, FirstSourceRotatesTheBlocks) {
  const auto recv = ll_dispatch(testing::ll_hand_tokens(), ExpertPlacement(4, 2), kLlHandMaxTokens);
  const LlRecv rotated = ll_canonicalize(recv[0], 1);
  // Expert 1 held (0,1) | (1,0); now (1,0) | (0,1). Expert 0's rows are all source 0's.
  EXPECT_EQ(first_rows(rotated.src_idx, 1, 3), (std::vector<int32_t>{0, 1, -1}));
  EXPECT_EQ(first_rows(rotated.src_idx, 0, 3), (std::vector<int32_t>{0, 1, -1}));
  EXPECT_EQ(rotated.layout_range, matrix<RowRange>(2, 2, {{0, 2}, {0, 0}, {1, 1}, {0, 1}}));
  EXPECT_EQ(rotated.x_bf16.at(1, 0, 0), exact_bf16(100));  // (1,0)
  EXPECT_EQ(rotated.x_bf16.at(1, 1, 1), exact_bf16(11));   // (0,1)
  EXPECT_EQ(ll_canonicalize(rotated), recv[0]);
  EXPECT_EQ(ll_in_epx_order(recv[0], 0), rotated);
  EXPECT_EQ(ll_in_epx_order(recv[1], 1), recv[1]);  // rank 1 of 2: source 0's block first, as canonical
  EXPECT_THROW(ll_canonicalize(recv[0], 2), std::invalid_argument);
  EXPECT_THROW(ll_canonicalize(recv[0], -1), std::invalid_argument);
}

TEST(LlCanonicalize, RejectsInconsistentRanges) {
  const auto recv = ll_dispatch(testing::ll_hand_tokens(), ExpertPlacement(4, 2), kLlHandMaxTokens);
  LlRecv overlapping = recv[0];  // expert 1: ranges (0,1) and (0,1) cover row 0 twice
  overlapping.layout_range.at(1, 1) = RowRange{0, 1};
  EXPECT_THROW(ll_canonicalize(overlapping), std::invalid_argument);

  LlRecv gap = recv[0];  // expert 1: (0,1) and (2,1), count 2
  gap.layout_range.at(1, 1) = RowRange{2, 1};
  EXPECT_THROW(ll_canonicalize(gap), std::invalid_argument);

  LlRecv late_start = recv[1];  // expert 0 of rank 1: (1,1) with count 1
  late_start.layout_range.at(0, 0) = RowRange{1, 1};
  EXPECT_THROW(ll_canonicalize(late_start), std::invalid_argument);

  LlRecv short_count = recv[0];  // ranges cover 2 rows, count says 3
  short_count.recv_count[1] = 3;
  EXPECT_THROW(ll_canonicalize(short_count), std::invalid_argument);

  LlRecv repeated_token = recv[0];  // expert 0 block of rank 0 holds token 0 twice
  repeated_token.src_idx.at(0, 1) = 0;
  EXPECT_THROW(ll_canonicalize(repeated_token), std::invalid_argument);
}

// Random routings: every (source rank, token, expert) has exactly one row carrying its x, the counts
// match the layouts, and canonicalize undoes any permutation of blocks and rows.
TEST(LlDispatch, RandomRoutingsFollowTheContract) {
  std::mt19937 rng(31337);
  const int num_ranks = 4;
  const int64_t max_tokens = 12;
  const ExpertPlacement placement(8, num_ranks);
  for (int trial = 0; trial < 10; ++trial) {
    const std::vector<LlTokens> tokens = testing::ll_random_tokens(rng, placement, max_tokens, 3, 4, false);
    std::vector<int32_t> per_expert(8, 0);
    for (const LlTokens& in : tokens) {
      const Layout layout = compute_layout(in.topk_idx, placement);
      for (int e = 0; e < 8; ++e)
        per_expert[static_cast<std::size_t>(e)] += layout.num_tokens_per_expert[static_cast<std::size_t>(e)];
    }
    const auto recv = ll_dispatch(tokens, placement, max_tokens);
    for (int s = 0; s < num_ranks; ++s) {
      const LlTokens& in = tokens[static_cast<std::size_t>(s)];
      for (int64_t t = 0; t < in.topk_idx.rows; ++t) {
        for (int64_t k = 0; k < 3; ++k) {
          const int64_t e = in.topk_idx.at(t, k);
          if (e == -1) continue;
          const LlRecv& r = recv[static_cast<std::size_t>(e / 2)];
          const int64_t row = ll_find_row(r, e % 2, s, t);
          ASSERT_GE(row, 0);
          for (int64_t h = 0; h < 4; ++h) EXPECT_EQ(r.x_bf16.at(e % 2, row, h), in.x.at(t, h));
        }
      }
    }
    for (int r = 0; r < num_ranks; ++r) {
      const LlRecv& canonical = recv[static_cast<std::size_t>(r)];
      LlRecv shuffled = canonical;
      for (int64_t e = 0; e < 2; ++e) {
        EXPECT_EQ(canonical.recv_count[static_cast<std::size_t>(e)], per_expert[static_cast<std::size_t>(2 * r + e)]);
        // Blocks in a random rank order, rows inside each block shuffled.
        std::vector<int> order = {0, 1, 2, 3};
        std::shuffle(order.begin(), order.end(), rng);
        int32_t next = 0;
        for (int s : order) {
          const RowRange range = canonical.layout_range.at(e, s);
          std::vector<int64_t> rows;
          for (int64_t row = range.begin; row < range.begin + range.count; ++row) rows.push_back(row);
          std::shuffle(rows.begin(), rows.end(), rng);
          shuffled.layout_range.at(e, s) = RowRange{next, range.count};
          for (int64_t from : rows) {
            shuffled.src_idx.at(e, next) = canonical.src_idx.at(e, from);
            for (int64_t h = 0; h < 4; ++h) shuffled.x_bf16.at(e, next, h) = canonical.x_bf16.at(e, from, h);
            ++next;
          }
        }
      }
      EXPECT_EQ(ll_canonicalize(shuffled), canonical);
    }
  }
}

}  // namespace
}  // namespace epx::ref
