// Argument checks (core/validate) and the HT and LL buffers' sizing (core/ht_areas, core/ll_areas): CPU only.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "bench/targets.hpp"
#include "core/ht_areas.hpp"
#include "core/ll_areas.hpp"
#include "core/validate.hpp"
#include "epx/error.hpp"
#include "epx/ll.hpp"
#include "support/ht_areas_invariants.hpp"
#include "support/ll_areas_invariants.hpp"

namespace epx::core {
namespace {

// A fake device address: the checks never dereference it.
void* address(std::uintptr_t a) { return reinterpret_cast<void*>(a); }

std::string refusal(const TensorRef& t, const Expect& e) {
  try {
    check_tensor(t, e);
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::invalid_argument);
    return error.what();
  }
  return "";
}

TEST(CheckTensor, AcceptsAMatchingTensor) {
  const TensorRef x = TensorRef::matrix(address(4096), ScalarType::bf16, 4, 256);
  EXPECT_EQ(refusal(x, {"x", {ScalarType::bf16, ScalarType::fp8_e4m3}, 4, 256, true, 16}), "");
}

TEST(CheckTensor, NamesTheWrongType) {
  const TensorRef x = TensorRef::matrix(address(4096), ScalarType::float32, 4, 256);
  EXPECT_NE(refusal(x, {"x", {ScalarType::bf16, ScalarType::fp8_e4m3}}).find("x must be bf16 or fp8_e4m3, got float32"),
            std::string::npos);
}

TEST(CheckTensor, NamesTheWrongShape) {
  const TensorRef w = TensorRef::matrix(address(4096), ScalarType::float32, 3, 8);
  EXPECT_NE(refusal(w, {"topk_weights", {ScalarType::float32}, 4, 8}).find("must have 4 rows"), std::string::npos);
  EXPECT_NE(refusal(w, {"topk_weights", {ScalarType::float32}, 3, 6}).find("must have 6 columns"), std::string::npos);
}

TEST(CheckTensor, RefusesNullPointersOnlyWhenThereIsData) {
  EXPECT_NE(
      refusal(TensorRef::matrix(nullptr, ScalarType::bf16, 2, 128), {"x", {ScalarType::bf16}}).find("null pointer"),
      std::string::npos);
  EXPECT_EQ(refusal(TensorRef::matrix(nullptr, ScalarType::bf16, 0, 128), {"x", {ScalarType::bf16}}), "");
}

TEST(CheckTensor, RefusesMisalignedDataAndPitch) {
  EXPECT_NE(
      refusal(TensorRef::matrix(address(4098), ScalarType::bf16, 2, 128), {"x", {ScalarType::bf16}, -1, -1, true, 16})
          .find("16-byte aligned"),
      std::string::npos);
  const TensorRef odd_pitch{address(4096), ScalarType::bf16, 2, 128, 129, 1};
  EXPECT_NE(refusal(odd_pitch, {"x", {ScalarType::bf16}, -1, -1, true, 16}).find("row pitch"), std::string::npos);
}

TEST(CheckTensor, ElementsAreAlwaysNaturallyAligned) {
  EXPECT_NE(refusal(TensorRef::matrix(address(4100), ScalarType::int64, 2, 8), {"topk_idx", {ScalarType::int64}})
                .find("8-byte aligned"),
            std::string::npos);
  EXPECT_EQ(refusal(TensorRef::matrix(address(4100), ScalarType::int32, 2, 8), {"topk_idx", {ScalarType::int32}}), "");
}

TEST(CheckTensor, DenseRowsNeedContiguousColumns) {
  const TensorRef column_major{address(4096), ScalarType::float32, 4, 56, 1, 4};
  EXPECT_NE(refusal(column_major, {"x_scales", {ScalarType::float32}}).find("contiguous columns"), std::string::npos);
  EXPECT_EQ(refusal(column_major, {"x_scales", {ScalarType::float32}, 4, 56, false}), "");  // strides accepted
}

TEST(CheckTensor, OptionalMeansAbsentOrValid) {
  EXPECT_NO_THROW(check_optional_tensor(TensorRef{}, {"bias", {ScalarType::bf16}, 4, 128}));
  EXPECT_THROW(check_optional_tensor(TensorRef::matrix(address(4096), ScalarType::bf16, 3, 128),
                                     {"bias", {ScalarType::bf16}, 4, 128}),
               Error);
}

// check_num_sms's refusal (empty if it accepts), for a GPU of 132 SMs.
std::string num_sms_refusal(int num_sms, int num_ranks, bool single_gpu) {
  try {
    check_num_sms("LlConfig::num_sms", num_sms, num_ranks, single_gpu, 132);
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::invalid_argument);
    return error.what();
  }
  return "";
}

TEST(CheckNumSms, EveryCtaOfACallMustBeResident) {
  EXPECT_EQ(num_sms_refusal(132, 8, false), "");  // a GPU per rank: every SM
  EXPECT_EQ(num_sms_refusal(1, 2, false), "");
  EXPECT_EQ(num_sms_refusal(66, 2, true), "");  // one GPU: every rank's CTAs together
  EXPECT_NE(num_sms_refusal(67, 2, true).find("needs 134 resident CTAs; this GPU has 132 SMs"), std::string::npos);
  // More CTAs than SMs would wait for each other until the bounded waits expire.
  EXPECT_NE(num_sms_refusal(133, 2, false).find("LlConfig::num_sms = 133 needs that many CTAs resident at once"),
            std::string::npos);
  EXPECT_NE(num_sms_refusal(0, 2, false).find("must be in [1, 1024], got 0"), std::string::npos);
  EXPECT_NE(num_sms_refusal(1025, 2, false).find("must be in [1, 1024], got 1025"), std::string::npos);
}

TEST(HtAreas, EveryAreaIsAlignedDisjointAndLargeEnough) {
  const HtBufferOptions o{4096, 7168, 8, 256};
  for (int R : {1, 2, 8, 72}) EXPECT_EQ(test::broken_ht_areas_invariant(ht_areas(o, R), o, R), "") << "R = " << R;
}

TEST(HtAreas, TheDeepSeekShapeOnTwoRanksNeedsAboutTwoHundredFortyMegabytes) {
  const HtAreas a = ht_areas({4096, 7168, 8, 256}, 2);
  // Two areas of 8192 BF16 rows of 7168 (117.4 MB each), plus scales, indices and weights.
  EXPECT_GT(a.total, std::size_t(2) * 8192 * 7168 * 2);
  EXPECT_LT(a.total, std::size_t(260) << 20);
}

// The stamped words of the HT protocols (counts, copy progress) match their own call only, on the low
// 32 bits of the call number, so they keep working past 2^32 calls.
TEST(HtStampedWords, MatchTheirOwnCallPastTwoToThe32) {
  const uint64_t wrap = uint64_t(1) << 32;
  for (const uint64_t call : {uint64_t(1), wrap - 1, wrap, wrap + 1, 3 * wrap + 7}) {
    const uint64_t word = stamped(call, 1234);
    EXPECT_TRUE(stamped_in(word, call)) << call;
    EXPECT_EQ(stamped_value(word), 1234u) << call;
    EXPECT_FALSE(stamped_in(word, call + 1)) << call;  // the next call waits for its own stamp
    EXPECT_FALSE(stamped_in(stamped(call - 1, kEveryGroup), call)) << call;
  }
  EXPECT_FALSE(stamped_in(0, 1));  // a word never written reads as call 0's stamp: not the first call's
}

TEST(LlAreas, EveryAreaIsAlignedDisjointAndLargeEnough) {
  for (int R : {1, 2, 8, 72}) {
    for (const LlBufferOptions& o : {LlBufferOptions{128, 7168, 8, 288}, LlBufferOptions{1, 128, 1, 72},
                                     LlBufferOptions{1024, 16384, 16, 4032}, LlBufferOptions{77, 2048, 3, 144}}) {
      EXPECT_EQ(test::broken_ll_areas_invariant(o, R), "") << "R = " << R << ", T_max = " << o.max_tokens_per_rank;
    }
  }
}

// What the combine kernel reads and writes of a row through its lines (core::ll_combine_line_col): every
// column of every hidden the buffer takes, once, in whole vectors and words that stay inside the row.
TEST(LlAreas, CombineLinesCarryEveryColumnOnce) {
  for (int hidden = 128; hidden <= core::kLlMaxHidden; hidden += 128) {
    const int lines = core::ll_combine_row_lines(2 * hidden);
    std::vector<int> carried(std::size_t(hidden), 0);
    for (int line = 0; line < lines + 8; ++line) {  // past the last line too: those carry nothing
      for (int vector = 0; vector < core::kLlLineVectors; ++vector) {
        const int col = core::ll_combine_line_col(hidden, lines, line, vector);
        if (col == hidden) continue;
        ASSERT_LT(line, lines) << "hidden " << hidden;
        if (vector < core::kLlLineVectors - 1) {
          ASSERT_LE(col + 8, hidden) << "hidden " << hidden << ", line " << line << ": a data vector past the row";
          for (int c = col; c < col + 8; ++c) ++carried[std::size_t(c)];
        } else {
          ASSERT_EQ(col % 2, 0) << "hidden " << hidden << ": a stamp-vector word not 4-byte aligned";
          for (int c = col; c < col + 6 && c < hidden; ++c) ++carried[std::size_t(c)];
        }
      }
    }
    for (int c = 0; c < hidden; ++c) ASSERT_EQ(carried[std::size_t(c)], 1) << "hidden " << hidden << ", column " << c;
  }
}

// The combine kernel's row form (core::ll_combine_row_form_col): every column of every hidden the buffer takes,
// once, in whole 16-byte vectors inside the row, over the line instructions the row's lines take; and a tail
// lane's vector is what its shuffles (combine.cu, from_line_form) take from the lines' stamp vectors: word k of
// tail lane 8 q + 7 is word (q + k) mod 3 of words 1-3 of line 4 k' + q + (q + k) / 3 of instruction k'.
TEST(LlAreas, CombineRowFormHoldsEveryColumnOnce) {
  for (int hidden = 128; hidden <= core::kLlMaxHidden; hidden += 128) {
    const int lines = core::ll_combine_row_lines(2 * hidden);
    const int instructions = (lines + 3) / 4;
    std::vector<int> held(std::size_t(hidden), 0);
    for (int k = 0; k < instructions + 2; ++k) {  // past the last instruction too: those hold nothing
      for (int lane = 0; lane < 32; ++lane) {
        const int col = core::ll_combine_row_form_col(hidden, lines, k, lane);
        if (col == hidden) continue;
        ASSERT_LT(k, instructions) << "hidden " << hidden;
        ASSERT_EQ(col % 8, 0) << "hidden " << hidden << ", instruction " << k << ", lane " << lane;
        ASSERT_LE(col + 8, hidden) << "hidden " << hidden << ", instruction " << k << ", lane " << lane;
        for (int c = col; c < col + 8; ++c) ++held[std::size_t(c)];
        if (lane % core::kLlLineVectors != core::kLlLineVectors - 1) continue;
        const int q = lane / core::kLlLineVectors;
        for (int word = 0; word < 4; ++word) {  // 2 columns a word
          const int line = 4 * k + q + (q + word) / 3;
          const int line_col = core::ll_combine_line_col(hidden, lines, line, core::kLlLineVectors - 1);
          ASSERT_EQ(line_col + 2 * ((q + word) % 3), col + 2 * word)
              << "hidden " << hidden << ", instruction " << k << ", lane " << lane << ", word " << word;
        }
      }
    }
    for (int c = 0; c < hidden; ++c) ASSERT_EQ(held[std::size_t(c)], 1) << "hidden " << hidden << ", column " << c;
  }
}

TEST(LlAreas, TheDeepSeekShapeOnTwoRanksStaysUnderSixtyFourMegabytes) {
  // The LL issue's memory target: at most 64 MB per rank for T_max 128, H 7168, top-8 of 256 on 2 ranks.
  // Two sets of 256 messages of 16384 + 272 bytes (8.5 MB) and of 8 x 128 combine rows of 116 lines (30.4 MB).
  const std::size_t bytes = LlBuffer::required_bytes({128, 7168, 8, 256}, 2);
  EXPECT_GT(bytes, std::size_t(36) * 1000 * 1000);
  EXPECT_LE(bytes, bench::kLlBufferTargetBytes);
}

TEST(LlAreas, RequiredBytesRefusesOptionsNoBufferCanHave) {
  EXPECT_THROW(LlBuffer::required_bytes({128, 7168, 8, 256}, 0), Error);
  EXPECT_THROW(LlBuffer::required_bytes({128, 7168, 8, 255}, 2), Error);
  EXPECT_THROW(LlBuffer::required_bytes({2048, 7168, 8, 256}, 2), Error);
  EXPECT_THROW(HtBuffer::required_bytes({4096, 7168, 8, 256}, 0), Error);
}

}  // namespace
}  // namespace epx::core
