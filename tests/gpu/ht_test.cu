// HT dispatch and combine against the CPU reference: exact, worst-case and cached forms, BF16 and FP8,
// int64 and int32 routing, weights and one or two biases, the team's count matrix, on one process per
// GPU and on one GPU with 2, 4, 8 ranks. Every rank rebuilds the whole team's inputs from the case seed,
// so it checks its own outputs against the reference of the whole exchange, bit for bit (combine too:
// the GPU adds ranks in the reference's order). Outputs are poisoned before the second and third
// dispatch, and the buffer's combine input before the combine that copies y into it, so a row that is
// not written (or read before it is) fails.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/ht_areas.hpp"
#include "epx/ht.hpp"
#include "epx/reference/ht.hpp"
#include "gpu_test_env.hpp"
#include "ht_fixture.hpp"
#include "single_gpu_ranks.hpp"

namespace epx::test {
namespace {

void run_rank(const HtCase& c, const Expected& x, Team& team, cudaStream_t stream) {
  const int rank = team.rank();
  const ref::HtTokens& in = x.tokens[rank];
  const ref::HtRecv& want = x.dispatch.recv[rank];
  const int64_t N = want.num_recv_tokens;

  RankInputs inputs = upload_inputs(c, in);
  const HtDispatchArgs& args = inputs.args;
  // Step 4's y and weights are strided (rows with padding), so neither the copy of the rows the peers
  // read nor the kernel's reads of this rank's own rows in place can assume dense rows. Made before the
  // buffer, as every array (single_gpu_ranks.hpp: no cudaMalloc or cudaFree between a team's calls).
  const int64_t y_stride = c.H + 64, w_stride = c.K + 3;
  const CombineInputs strided = upload_combine_inputs(c, x, rank, N, y_stride, w_stride);

  HtBuffer buffer(team, HtBufferOptions{std::max(c.T, 1), c.H, c.K, x.E},
                  c.num_sms > 0 ? HtConfig{c.num_sms} : HtConfig{});
  const HtStreams on{stream};

  // Each call goes to the buffer together with the other ranks' (submit_together, single_gpu_ranks.hpp),
  // after its poisons and copies. The exact form returns only once every rank's kernel has sent its
  // counts; every rank has passed the meeting before the call by then, so it submits its own.
  // 1. Exact form.
  // Outputs are complete in stream order (the exact form returns once N is known, not once rows landed),
  // so every check below synchronises the stream first.
  const HtDispatchResult exact = submit_together([&] { return buffer.dispatch(args, on); });
  ASSERT_NO_FATAL_FAILURE(complete(team, stream));
  ASSERT_EQ(exact.num_recv_tokens, N) << "rank " << rank;
  EXPECT_EQ(exact.num_recv_tokens_per_expert_host, want.num_recv_tokens_per_expert) << "rank " << rank;
  check_dispatch(c, rank, exact, want, N);
  check_count_matrix(rank, exact, x.dispatch.handle);

  // 2. Worst-case form, outputs poisoned first.
  poison(exact.recv_x, stream);
  poison(exact.recv_src_idx, stream);
  poison(exact.recv_topk_idx, stream);
  poison(exact.recv_topk_weights, stream);
  if (c.fp8) poison(exact.recv_x_scales, stream);
  HtDispatchArgs worst = args;
  worst.num_worst_tokens = int64_t(x.R) * std::max(c.T, 1);
  const HtDispatchResult padded = submit_together([&] { return buffer.dispatch(worst, on); });
  ASSERT_NO_FATAL_FAILURE(complete(team, stream));
  EXPECT_EQ(padded.num_rows, worst.num_worst_tokens);
  check_dispatch(c, rank, padded, want, N);
  check_count_matrix(rank, padded, x.dispatch.handle);

  // 3. Cached form with the exact form's handle, outputs poisoned first.
  poison(padded.recv_x, stream);
  poison(padded.recv_src_idx, stream);
  HtDispatchArgs cached = args;
  cached.cached = exact.handle;
  const HtDispatchResult again = submit_together([&] { return buffer.dispatch(cached, on); });
  ASSERT_NO_FATAL_FAILURE(complete(team, stream));
  ASSERT_EQ(again.num_recv_tokens, N);
  EXPECT_EQ(again.num_recv_tokens_per_expert_host, want.num_recv_tokens_per_expert) << "rank " << rank;
  check_dispatch(c, rank, again, want, N);
  check_count_matrix(rank, again, x.dispatch.handle);

  // 4. Combine with weights and bias (strided, above), through the exact form's handle.
  HtCombineArgs combine = strided.args;
  combine.handle = exact.handle;
  poison(buffer.combine_input(N, c.H), stream);
  const HtCombineResult out = submit_together([&] { return buffer.combine(combine, on); });
  ASSERT_NO_FATAL_FAILURE(complete(team, stream));
  check_combine(c, rank, out, x.combine[rank]);

  // 5. Combine again with y and the weights written straight into the buffer's combine input.
  poison(out.x, stream);
  const TensorRef in_place = buffer.combine_input(N, c.H);
  const TensorRef in_place_weights = buffer.combine_input_weights(N, c.K);
  ASSERT_EQ(cudaMemcpy2DAsync(in_place.data, c.H * 2, strided.y->data, y_stride * 2, c.H * 2, N,
                              cudaMemcpyDeviceToDevice, stream),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy2DAsync(in_place_weights.data, c.K * 4, strided.weights->data, w_stride * 4, c.K * 4, N,
                              cudaMemcpyDeviceToDevice, stream),
            cudaSuccess);
  combine.y = in_place;
  combine.topk_weights = in_place_weights;
  const HtCombineResult zero_copy = submit_together([&] { return buffer.combine(combine, on); });
  ASSERT_NO_FATAL_FAILURE(complete(team, stream));
  check_combine(c, rank, zero_copy, x.combine[rank]);
}

class HtExchange : public ::testing::TestWithParam<HtCase> {};

TEST_P(HtExchange, MatchesReference) {
  const HtCase& c = GetParam();
  const uint32_t seed = uint32_t(std::hash<std::string>{}(c.name));
  if (c.single_gpu_ranks == 0) EPX_REQUIRE_WORLD_SIZE(2);
  const Expected x = build_expected(c, c.single_gpu_ranks == 0 ? rank_info().world_size : c.single_gpu_ranks, seed);
  on_ranks(c.single_gpu_ranks, [&](Team& team, cudaStream_t stream) { run_rank(c, x, team, stream); });
}

std::vector<HtCase> cases() {
  using Rt = Routing;
  std::vector<HtCase> v = {
      // One process per GPU.
      {0, 4096, 7168, 8, 256, Rt::uniform, 0.1, false, false, false, 1, "World_DeepSeekShape_Bf16"},
      {0, 4096, 7168, 8, 256, Rt::uniform, 0.1, true, true, true, 1, "World_DeepSeekShape_Fp8ColumnMajorScales_Int32"},
      {0, 0, 2048, 6, 64, Rt::uniform, 0.1, false, false, false, 1, "World_NoTokens"},
      {0, 1, 2048, 1, kExpertsEqualRanks, Rt::uniform, 0.0, false, false, false, 1, "World_OneToken_ExpertsEqualRanks"},
      {0, 100, 2048, 8, 64, Rt::zipf, 0.1, false, false, false, 4, "World_Zipf_Aligned4_TwoBiases", 0, true},
      {0, 100, 7168, 6, 256, Rt::one_hot, 0.1, true, false, false, 1, "World_OneHotExpert_Fp8"},
  };
  for (int R : {2, 4, 8}) {
    const std::string n = "SingleGpu" + std::to_string(R) + "_";
    v.push_back({R, 100, 2048, 8, 64, Rt::uniform, 0.1, false, false, false, 1, n + "Uniform"});
    v.push_back({R, 0, 2048, 6, 64, Rt::uniform, 0.1, false, false, false, 1, n + "NoTokens"});
    v.push_back(
        {R, 1, 2048, 1, kExpertsEqualRanks, Rt::uniform, 0.0, false, true, false, 1, n + "OneToken_ExpertsEqualRanks"});
    v.push_back({R, 512, 2048, 6, 256, Rt::zipf, 0.1, true, true, true, 8, n + "Zipf_Fp8_Int32"});
    v.push_back({R, 200, 2048, 8, 8 * R, Rt::one_hot, 0.0, false, false, false, 1, n + "OneHotExpert"});
  }
  // The bench's shape on one GPU: rows of 7 pieces in the combine, many rounds of its warps, the copy of y
  // running beside the pull, and the FP8 form with int32 ids and column-major scales.
  v.push_back({2, 4096, 7168, 8, 256, Rt::uniform, 0.1, false, false, false, 1, "SingleGpu2_DeepSeekShape_Bf16"});
  v.push_back({4, 4096, 7168, 8, 256, Rt::uniform, 0.1, true, true, true, 1,
               "SingleGpu4_DeepSeekShape_Fp8ColumnMajorScales_Int32"});
  v.push_back({8, 64, 2048, 8, 8, Rt::uniform, 0.0, false, false, false, 1, "SingleGpu8_EveryTokenToEveryRank"});
  // More than 32 ranks: the kernels keep a lane's ranks lane, lane + 32, ... (tokens reach rank 32 too).
  // Every rank's kernels must be resident at once: 33 ranks of 3 SMs each passed on an H200, 40 did
  // not (every rank's count wait expired).
  v.push_back({33, 64, 2048, 8, 66, Rt::uniform, 0.1, false, false, false, 1, "SingleGpu33_Uniform", 3});
  // A row of 2304 bytes: the combine pulls rows in pieces of 2 KiB, so its last piece is partial (and the
  // biases' last chunk too).
  v.push_back(
      {2, 100, 1152, 8, 64, Rt::uniform, 0.1, true, false, false, 1, "SingleGpu2_Hidden1152_Fp8_TwoBiases", 0, true});
  // Send positions that carry over between the layout kernel's tiles (of 256 tokens); more than 8 slots.
  v.push_back({2, 2500, 2048, 9, 64, Rt::zipf, 0.1, false, false, false, 1, "SingleGpu2_TenLayoutTiles_NineSlots"});
  // Half the tokens name no expert (top-1), among tokens that do: the combine's loader writes those (their
  // biases alone) as it meets them, while its warps claim tokens past their first two (T > 2 x 320 warps).
  v.push_back({2, 2000, 2048, 1, 64, Rt::uniform, 0.5, false, false, false, 1, "SingleGpu2_HalfTheTokensNameNoExpert",
               0, true});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, HtExchange, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<HtCase>& info) { return info.param.name; });

// Makes a new buffer's state that of one that has run `calls` dispatches and combines: this rank's
// call numbers and the done words its peers write in its memory, each with the stamp of call `calls`
// (they write them only once this rank has joined a call, so no peer's signal can come before these
// writes).
void start_calls_at(HtBuffer& buffer, const HtBufferOptions& options, int R, uint64_t calls) {
  const core::HtAreas areas = core::ht_areas(options, R);
  char* base = static_cast<char*>(buffer.combine_input(0, options.hidden).data) - areas.combine_input;
  const std::vector<uint64_t> sequence(core::kHtFlagKinds, calls);
  const std::vector<uint64_t> done(std::size_t(core::kHtFlagKinds) * R * core::kMaxCtas, core::stamped(calls, 1));
  copy_host_to_device(base + areas.sequence, sequence.data(), sequence.size() * sizeof(uint64_t));
  copy_host_to_device(base + areas.done_words, done.data(), done.size() * sizeof(uint64_t));
}

// Two rounds of dispatch and combine (with the copy of y) on a buffer whose call numbers start just
// below 2^32: round 1 is call 2^32 - 1, round 2 call 2^32, whose stamp (its low 32 bits) is 0. Round 2
// has other routing and other y, and the combine input is poisoned before each combine, so a count or
// copy-progress word of round 1 taken for round 2's gives wrong rows. Every device array of both rounds
// is made before the first (single_gpu_ranks.hpp: no cudaMalloc or cudaFree between a team's calls), and
// each call is submitted together with the other ranks' (submit_together), after its copies and poisons.
void cross_two_to_the_32(const HtCase& c, const std::vector<Expected>& rounds, Team& team, cudaStream_t stream) {
  const int rank = team.rank();
  RankInputs inputs = allocate_inputs(c.T, c.H, c.K);
  std::vector<CombineInputs> combine_inputs;
  for (const Expected& x : rounds) {
    combine_inputs.push_back(upload_combine_inputs(c, x, rank, x.dispatch.recv[rank].num_recv_tokens, c.H, c.K));
  }
  const HtBufferOptions options{std::max(c.T, 1), c.H, c.K, rounds[0].E};
  HtBuffer buffer(team, options);
  start_calls_at(buffer, options, rounds[0].R, (uint64_t(1) << 32) - 2);
  const HtStreams on{stream};
  for (std::size_t i = 0; i < rounds.size(); ++i) {
    const Expected& x = rounds[i];
    const ref::HtRecv& want = x.dispatch.recv[rank];
    const int64_t N = want.num_recv_tokens;
    write_inputs(c, x.tokens[rank], inputs);
    const HtDispatchResult got = submit_together([&] { return buffer.dispatch(inputs.args, on); });
    ASSERT_NO_FATAL_FAILURE(complete(team, stream));
    ASSERT_EQ(got.num_recv_tokens, N) << "rank " << rank;
    check_dispatch(c, rank, got, want, N);

    HtCombineArgs& args = combine_inputs[i].args;
    args.handle = got.handle;
    poison(buffer.combine_input(N, c.H), stream);
    const HtCombineResult out = submit_together([&] { return buffer.combine(args, on); });
    ASSERT_NO_FATAL_FAILURE(complete(team, stream));
    check_combine(c, rank, out, x.combine[rank]);
  }
}

TEST(HtCallNumbers, CrossTwoToThe32) {
  int found = 0;
  for (const HtCase& c : cases()) {
    if (c.name != "SingleGpu2_Uniform" && c.name != "World_Zipf_Aligned4_TwoBiases") continue;
    ++found;
    if (c.single_gpu_ranks == 0 && rank_info().world_size < 2) continue;  // the single-GPU case still runs
    SCOPED_TRACE(c.name);
    const int R = c.single_gpu_ranks == 0 ? rank_info().world_size : c.single_gpu_ranks;
    const uint32_t seed = uint32_t(std::hash<std::string>{}(c.name));
    std::vector<Expected> rounds;
    rounds.push_back(build_expected(c, R, seed));
    rounds.push_back(build_expected(c, R, seed + 1));
    on_ranks(c.single_gpu_ranks,
             [&](Team& team, cudaStream_t stream) { cross_two_to_the_32(c, rounds, team, stream); });
  }
  EXPECT_EQ(found, 2) << "a case this test runs was renamed or removed from cases()";
}

}  // namespace
}  // namespace epx::test
