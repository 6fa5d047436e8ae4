// LL dispatch and combine against the CPU reference, on one process per GPU and on one GPU with 2, 4
// and 8 ranks: BF16 and FP8 (plain, power-of-two scales, UE8M0; row- and column-major scales), int64
// and int32 routing, uniform, Zipf and one-hot routings with -1 slots and repeated experts, T from 0
// to T_max, x with NaNs, infinities and subnormals. Each case runs three times on one buffer (both
// buffer sets), outputs poisoned before every call; combine runs in the local order (with the weights
// given to dispatch, or in the cases without dispatch weights with those given to combine) and the
// naive one (weights given to combine), each compared bit for bit with the reference.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "epx/ll.hpp"
#include "gpu_test_env.hpp"
#include "ll_fixture.hpp"
#include "single_gpu_ranks.hpp"

namespace epx::test {
namespace {

void run_rank(const LlCase& c, const LlExpected& x, Team& team, cudaStream_t stream) {
  const int rank = team.rank();
  LlBuffer buffer(team, ll_buffer_options(c, x), LlConfig{c.num_sms});
  const LlRankInputs in = upload_ll_inputs(c, x, rank);
  const LlOutputs out = allocate_ll_outputs(c, x, buffer);
  // The second dispatch and combine use the other buffer set; the third reuses the first set, so its
  // "set is free" check compares against a signal the peers sent (not the initial zeros).
  for (int round = 0; round < 3; ++round) {
    ll_exchange_and_check(c, x, buffer, team, in, out, stream);
    buffer.check_errors();  // what a kernel recorded stays until reported
  }
}

class LlExchange : public ::testing::TestWithParam<LlCase> {};

TEST_P(LlExchange, MatchesReference) {
  const LlCase& c = GetParam();
  if (c.single_gpu_ranks == 0) EPX_REQUIRE_WORLD_SIZE(2);
  const int R = team_size(c);
  if (c.E % R != 0) GTEST_SKIP() << c.E << " experts do not divide among " << R << " ranks";
  const LlExpected x = build_ll_expected(c, R, uint32_t(std::hash<std::string>{}(c.name)));
  on_ranks(c.single_gpu_ranks, [&](Team& team, cudaStream_t stream) { run_rank(c, x, team, stream); });
}

std::vector<LlCase> cases() {
  using P = LlPayload;
  using Rt = Routing;
  constexpr int kEq = kExpertsEqualRanks;
  // team, T, T_max, H, K, E, routing, p_empty, payload, int32 ids, dispatch weights, column-major scales,
  // repeated slot, roomy buffer, name
  return {
      // One process per GPU (EP = the world size, 2 on a two-GPU machine); T_max 128.
      {0, 128, 128, 7168, 8, 256, Rt::uniform, 0.1, P::fp8, false, true, false, false, false, "World_DeepSeek_Fp8"},
      {0, 128, 128, 7168, 8, 256, Rt::uniform, 0.1, P::fp8_ue8m0, true, true, true, false, false,
       "World_DeepSeek_Fp8Ue8m0_ColumnMajorScales_Int32"},
      {0, 128, 128, 7168, 8, 256, Rt::uniform, 0.1, P::bf16, false, true, false, false, false, "World_DeepSeek_Bf16"},
      {0, 77, 128, 4096, 8, 288, Rt::zipf, 0.1, P::fp8_round_scale, false, true, false, false, false,
       "World_T77_E288_Zipf_Fp8RoundScale"},
      {0, 0, 128, 2048, 8, 64, Rt::uniform, 0.1, P::fp8, false, true, false, false, false, "World_NoTokens"},
      {0, 1, 128, 2048, 1, kEq, Rt::uniform, 0.0, P::bf16, true, true, false, false, false,
       "World_OneToken_ExpertsEqualRanks_Int32"},
      {0, 128, 128, 4096, 8, 64, Rt::one_hot, 0.1, P::fp8, false, false, false, false, false,
       "World_OneHot_FullExpert_NoDispatchWeights"},
      {0, 128, 128, 7168, 1, 256, Rt::zipf, 0.2, P::bf16, true, false, false, false, false, "World_K1_Zipf_Bf16_Int32"},
      {0, 77, 128, 2048, 8, 64, Rt::uniform, 0.1, P::fp8_round_scale, false, true, true, true, false,
       "World_RepeatedExperts_Fp8RoundScale_ColumnMajorScales"},
      {0, 77, 128, 2048, 1, 64, Rt::uniform, 0.1, P::fp8_ue8m0, false, true, false, false, true,
       "World_SmallerThanBuffer_Ue8m0"},
      {0, 77, 128, 2048, 8, 64, Rt::uniform, 1.0, P::fp8, false, true, false, false, false, "World_AllSlotsEmpty"},
      // NaNs, infinities, zeros and subnormals in x (the FP8 cast's amax, scale and products).
      {0, 77, 128, 2048, 8, 64, Rt::uniform, 0.1, P::fp8, false, true, false, false, false, "World_SpecialValues_Fp8",
       0, true},
      // More than 8 slots (the block rows' count for up to 16 slots, headers and combine rows of 16 slots).
      {0, 128, 128, 2048, 16, 256, Rt::uniform, 0.1, P::fp8, false, true, false, false, false, "World_K16_Fp8"},
      {0, 77, 128, 2048, 12, 64, Rt::zipf, 0.1, P::bf16, true, true, false, true, false,
       "World_K12_Zipf_RepeatedExperts_Bf16_Int32"},
      // The largest T_max (block rows up to 1023, many tokens per lane in the block-row count), and grids
      // of 1 and 3 CTAs (one CTA sends the counts, writes the outputs and signals; warps take many items).
      {0, 1024, 1024, 2048, 16, 64, Rt::zipf, 0.1, P::fp8, false, true, false, true, false,
       "World_T1024_K16_Zipf_RepeatedExperts_Fp8"},
      {0, 77, 128, 2048, 8, 64, Rt::uniform, 0.1, P::fp8, false, true, false, false, false, "World_OneSm_Fp8", 1},
      {0, 128, 128, 4096, 8, 256, Rt::zipf, 0.1, P::bf16, true, true, false, true, false,
       "World_ThreeSms_Zipf_RepeatedExperts_Bf16_Int32", 3},
      // One GPU, 2 ranks.
      {2, 77, 128, 2048, 8, 64, Rt::uniform, 0.1, P::fp8, false, true, false, false, false, "SingleGpu2_Uniform_Fp8"},
      // The bench's shape on one GPU.
      {2, 128, 128, 7168, 8, 256, Rt::uniform, 0.1, P::fp8, false, true, false, false, false,
       "SingleGpu2_DeepSeek_Fp8"},
      {2, 128, 128, 2048, 8, 64, Rt::zipf, 0.1, P::fp8_ue8m0, true, true, true, false, false,
       "SingleGpu2_Zipf_Ue8m0_ColumnMajorScales_Int32"},
      {2, 0, 128, 2048, 8, 64, Rt::uniform, 0.1, P::bf16, false, true, false, false, false, "SingleGpu2_NoTokens_Bf16"},
      {2, 1, 128, 2048, 1, kEq, Rt::uniform, 0.0, P::fp8_round_scale, false, false, false, false, false,
       "SingleGpu2_OneToken_ExpertsEqualRanks"},
      {2, 32, 32, 4096, 8, 288, Rt::one_hot, 0.1, P::bf16, true, true, false, true, false,
       "SingleGpu2_E288_OneHot_RepeatedExperts_Bf16"},
      // One slot, often empty, on one SM per rank: each warp sends many items, some of tokens that go
      // nowhere between others that do.
      {2, 128, 128, 2048, 1, 64, Rt::uniform, 0.3, P::fp8, false, true, false, false, false,
       "SingleGpu2_K1_ManyEmpty_OneSmEach_Fp8", 1},
      // Rows of 640 columns: FP8, 6 lines in one send item of 8 (5 scale groups; lines past the row unsent).
      {2, 16, 16, 640, 8, 64, Rt::uniform, 0.1, P::fp8, false, true, false, false, false, "SingleGpu2_Hidden640_Fp8"},
      // Rows of 2560 columns: the last combine line with any of the row's rest in its stamp vector holds
      // two of its three words (4096 and 16384: one; 7168, 2048 and 640: all three).
      {2, 16, 16, 2560, 8, 64, Rt::zipf, 0.1, P::bf16, false, true, false, false, false, "SingleGpu2_Hidden2560_Bf16"},
      // The largest hidden: 128 FP8 scale groups over 19 send items; BF16 parts take two batches.
      {2, 16, 16, 16384, 8, 64, Rt::uniform, 0.1, P::fp8, false, true, true, false, false,
       "SingleGpu2_Hidden16384_Fp8_ColumnMajorScales"},
      {2, 16, 16, 16384, 8, 64, Rt::zipf, 0.1, P::bf16, false, true, false, false, false,
       "SingleGpu2_Hidden16384_Zipf_Bf16"},
      // More than 1024 top-k entries (T = 256, K = 8): the send step stages the table's entries past each
      // thread's first two in batches (kStagedBatch), here one partial batch; warps take several combine items.
      {2, 256, 256, 2048, 8, 64, Rt::zipf, 0.1, P::fp8, false, true, false, false, false, "SingleGpu2_T256_Zipf_Fp8"},
      // One GPU, 4 ranks (smaller T_max).
      {4, 77, 80, 2048, 8, 64, Rt::uniform, 0.1, P::bf16, false, true, false, false, false, "SingleGpu4_Uniform_Bf16"},
      {4, 32, 32, 2048, 8, 256, Rt::one_hot, 0.1, P::fp8_round_scale, true, false, false, false, false,
       "SingleGpu4_E256_OneHot_Fp8RoundScale_NoDispatchWeights"},
      {4, 32, 64, 2048, 8, 64, Rt::zipf, 0.2, P::fp8_ue8m0, false, true, false, true, true,
       "SingleGpu4_Zipf_Ue8m0_RepeatedExperts_SmallerThanBuffer"},
      {4, 0, 32, 2048, 8, 64, Rt::uniform, 0.1, P::fp8, false, true, false, false, false, "SingleGpu4_NoTokens"},
      {4, 1, 32, 2048, 1, kEq, Rt::uniform, 0.0, P::bf16, false, true, false, false, false,
       "SingleGpu4_OneToken_ExpertsEqualRanks"},
      {4, 32, 32, 2048, 16, 64, Rt::uniform, 0.1, P::fp8_ue8m0, false, true, false, false, false,
       "SingleGpu4_K16_Ue8m0"},
      {4, 64, 64, 2048, 8, 64, Rt::zipf, 0.1, P::fp8, false, true, false, false, false, "SingleGpu4_OneSmEach_Fp8", 1},
      {4, 64, 64, 4096, 8, 64, Rt::zipf, 0.1, P::fp8_round_scale, false, true, true, false, false,
       "SingleGpu4_SpecialValues_Fp8RoundScale_ColumnMajorScales", 0, true},
      // One GPU, 8 ranks.
      {8, 32, 32, 2048, 8, 64, Rt::uniform, 0.1, P::fp8, false, true, false, false, false, "SingleGpu8_Uniform_Fp8"},
      {8, 32, 32, 2048, 8, kEq, Rt::uniform, 0.0, P::fp8_ue8m0, true, true, true, false, false,
       "SingleGpu8_EveryTokenToEveryRank_Ue8m0_Int32"},
      {8, 16, 32, 2048, 8, 64, Rt::zipf, 0.3, P::bf16, true, false, false, true, false,
       "SingleGpu8_Zipf_Bf16_NoDispatchWeights"},
      {8, 1, 32, 2048, 1, 64, Rt::one_hot, 0.0, P::fp8_round_scale, false, true, false, false, false,
       "SingleGpu8_OneToken_OneHot"},
  };
}

INSTANTIATE_TEST_SUITE_P(Cases, LlExchange, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<LlCase>& info) { return info.param.name; });

}  // namespace
}  // namespace epx::test
