// HT calls in the ways users run them besides the plain stream: on the buffer's communication stream
// with events (overlap with compute), captured once into a CUDA graph (worst-case form) and replayed
// with new inputs, a cached dispatch made while its stream is still busy, and the outputs copied out
// while the next dispatch is made on another stream. Every call or graph
// launch that runs kernels goes to the GPU together with the other ranks' (submit_together,
// single_gpu_ranks.hpp), after its copies.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "bench/hold_stream.hpp"
#include "expect_error.hpp"
#include "gpu_test_env.hpp"
#include "ht_fixture.hpp"
#include "single_gpu_ranks.hpp"

namespace epx::test {
namespace {

const HtCase kCase{0, 256, 2048, 8, 64, Routing::uniform, 0.1, false, false, false, 1, "modes"};

void async_round(const std::vector<Expected>& expected, Team& team, cudaStream_t stream) {
  const int rank = team.rank();
  const Expected& x = expected[0];
  RankInputs in = upload_inputs(kCase, x.tokens[rank]);
  const int64_t N = x.dispatch.recv[rank].num_recv_tokens;
  // Every array before the buffer (single_gpu_ranks.hpp: no cudaMalloc or cudaFree between a team's calls).
  CombineInputs combine = upload_combine_inputs(kCase, x, rank, N, kCase.H, kCase.K);
  HtBuffer buffer(team, HtBufferOptions{kCase.T, kCase.H, kCase.K, kCase.E});
  cudaEvent_t before;
  ASSERT_EQ(cudaEventCreateWithFlags(&before, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(before, stream), cudaSuccess);
  const HtDispatchResult d = submit_together([&] { return buffer.dispatch(in.args, HtStreams{stream, true, before}); });
  ASSERT_NE(d.finished, nullptr);
  ASSERT_EQ(cudaStreamWaitEvent(stream, d.finished, 0), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  check_dispatch(kCase, rank, d, x.dispatch.recv[rank], N);

  combine.args.handle = d.handle;
  const HtCombineResult c = submit_together([&] {
    return buffer.combine(combine.args, HtStreams{stream, true, nullptr});
  });
  ASSERT_NE(c.finished, nullptr);
  ASSERT_EQ(cudaStreamWaitEvent(stream, c.finished, 0), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  check_combine(kCase, rank, c, x.combine[rank]);
  cudaEventDestroy(before);
  cudaEventDestroy(d.finished);
  cudaEventDestroy(c.finished);
}

// Captures a worst-case dispatch and a combine once, then replays the graph with each case's inputs
// copied into the captured input buffers. The combine writes its sums where the caller says (a buffer
// made without its own combine output, as a graph that keeps its outputs in its own memory would).
void graph_rounds(const std::vector<Expected>& expected, Team& team, cudaStream_t stream) {
  const int rank = team.rank();
  const int64_t worst = int64_t(team.size()) * kCase.T;
  RankInputs in = upload_inputs(kCase, expected[0].tokens[rank]);
  DeviceArray y(std::size_t(worst) * kCase.H * 2), yw(std::size_t(worst) * kCase.K * 4);
  DeviceArray bias(std::size_t(kCase.T) * kCase.H * 2);
  DeviceArray out(std::size_t(kCase.T) * kCase.H * 2), out_weights(std::size_t(kCase.T) * kCase.K * 4);
  HtBufferOptions options{kCase.T, kCase.H, kCase.K, kCase.E};
  options.combine_output = false;
  HtBuffer buffer(team, options);

  HtDispatchArgs args = in.args;
  args.num_worst_tokens = worst;
  HtCombineArgs combine_args;
  combine_args.y = TensorRef::matrix(y.data, ScalarType::bf16, worst, kCase.H);
  combine_args.topk_weights = TensorRef::matrix(yw.data, ScalarType::float32, worst, kCase.K);
  combine_args.bias = TensorRef::matrix(bias.data, ScalarType::bf16, kCase.T, kCase.H);
  combine_args.out = TensorRef::matrix(out.data, ScalarType::bf16, kCase.T, kCase.H);
  combine_args.out_weights = TensorRef::matrix(out_weights.data, ScalarType::float32, kCase.T, kCase.K);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const HtDispatchResult d = buffer.dispatch(args, HtStreams{stream});
  combine_args.handle = d.handle;
  const HtCombineResult c = buffer.combine(combine_args, HtStreams{stream});
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  EXPECT_EQ(c.x.data, out.data);
  EXPECT_EQ(c.topk_weights.data, out_weights.data);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

  for (const Expected& x : expected) {
    const ref::HtTokens& t = x.tokens[rank];
    write_inputs(kCase, t, in);  // the same addresses the graph captured
    copy_to_device(y.data, x.y[rank].y.data);
    copy_to_device(yw.data, x.y[rank].topk_weights.data);
    copy_to_device(bias.data, x.bias[rank].data);
    // One launch of both captured calls (the graph orders their kernels), as LL's replays (ll_modes_test.cu).
    submit_together([&] { ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess); });
    ASSERT_NO_FATAL_FAILURE(complete(team, stream));
    check_dispatch(kCase, rank, d, x.dispatch.recv[rank], x.dispatch.recv[rank].num_recv_tokens);
    check_combine(kCase, rank, c, x.combine[rank]);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// A cached dispatch of an exact-form dispatch has N and the per-expert counts from its handle, so it
// returns without waiting for its kernel: made while a kernel holds its stream for 200 ms, it returns with
// the stream still busy. (Until 2026-11-29 it waited for its kernel's count, as the exact form does.)
void cached_without_host_wait(const std::vector<Expected>& expected, Team& team, cudaStream_t stream) {
  constexpr uint64_t kHoldNs = 200'000'000;
  bench::load_hold_kernel();
  const int rank = team.rank();
  const Expected& x = expected[0];
  RankInputs in = upload_inputs(kCase, x.tokens[rank]);
  const int64_t N = x.dispatch.recv[rank].num_recv_tokens;
  HtBuffer buffer(team, HtBufferOptions{kCase.T, kCase.H, kCase.K, kCase.E});
  const HtDispatchResult exact = submit_together([&] { return buffer.dispatch(in.args, HtStreams{stream}); });
  ASSERT_NO_FATAL_FAILURE(complete(team, stream));
  HtDispatchArgs cached = in.args;
  cached.cached = exact.handle;
  cudaError_t busy = cudaSuccess;
  const HtDispatchResult again = submit_together([&] {
    bench::hold_stream(stream, kHoldNs);
    HtDispatchResult r = buffer.dispatch(cached, HtStreams{stream});
    busy = cudaStreamQuery(stream);
    return r;
  });
  EXPECT_EQ(busy, cudaErrorNotReady) << "rank " << rank << ": the cached dispatch returned once its kernel had run";
  EXPECT_EQ(again.num_recv_tokens, N) << "rank " << rank;
  EXPECT_EQ(again.num_recv_tokens_per_expert_host, exact.num_recv_tokens_per_expert_host) << "rank " << rank;
  ASSERT_NO_FATAL_FAILURE(complete(team, stream));
  check_dispatch(kCase, rank, again, x.dispatch.recv[rank], N);
}

// copy_dispatch_outputs is ordered before the next call on the buffer, whatever that call's stream: with
// the copy queued behind 100 ms of other work on one stream and the next dispatch made at once on
// another, the copies still hold the first dispatch's rows. (Copies the caller queues itself after a
// dispatch are ordered only by its streams.) Arguments it cannot honour are refused first.
void copies_before_the_next_dispatch(const std::vector<Expected>& expected, Team& team, cudaStream_t stream) {
  constexpr uint64_t kHoldNs = 100'000'000;
  bench::load_hold_kernel();
  const int rank = team.rank();
  RankInputs first = upload_inputs(kCase, expected[0].tokens[rank]);
  RankInputs second = upload_inputs(kCase, expected[1].tokens[rank]);
  const int64_t N = expected[0].dispatch.recv[rank].num_recv_tokens;
  const int E_local = kCase.E / team.size();
  const int topk_bytes = element_size(first.args.topk_idx.type);
  DeviceArray x(std::size_t(N) * kCase.H * 2), src(std::size_t(N) * 4), counts(std::size_t(E_local) * 4);
  DeviceArray topk(std::size_t(N) * kCase.K * topk_bytes), weights(std::size_t(N) * kCase.K * 4);
  cudaStream_t other;
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  HtBuffer buffer(team, HtBufferOptions{kCase.T, kCase.H, kCase.K, kCase.E});

  HtDispatchCopies to;
  to.recv_x = TensorRef::matrix(x.data, ScalarType::bf16, N, kCase.H);
  expect_error(ErrorKind::invalid_argument, {"before any dispatch"},
               [&] { buffer.copy_dispatch_outputs(to, HtStreams{stream}); });
  const HtDispatchResult d = submit_together([&] { return buffer.dispatch(first.args, HtStreams{stream}); });
  ASSERT_NO_FATAL_FAILURE(complete(team, stream));
  to.recv_x_scales = TensorRef::matrix(weights.data, ScalarType::float32, N, kCase.H / 128);
  expect_error(ErrorKind::invalid_argument, {"recv_x_scales is given, but the latest dispatch has no such output"},
               [&] { buffer.copy_dispatch_outputs(to, HtStreams{stream}); });
  to.recv_x_scales = {};
  to.recv_x.rows = N + 1;
  expect_error(ErrorKind::invalid_argument, {"recv_x must have " + std::to_string(N) + " rows"},
               [&] { buffer.copy_dispatch_outputs(to, HtStreams{stream}); });

  HtDispatchResult copied = d;
  copied.recv_x = TensorRef::matrix(x.data, d.recv_x.type, N, kCase.H);
  copied.recv_src_idx = TensorRef::vector(src.data, ScalarType::int32, N);
  copied.recv_topk_idx = TensorRef::matrix(topk.data, d.recv_topk_idx.type, N, kCase.K);
  copied.recv_topk_weights = TensorRef::matrix(weights.data, ScalarType::float32, N, kCase.K);
  copied.num_recv_tokens_per_expert = TensorRef::vector(counts.data, ScalarType::int32, E_local);
  to = HtDispatchCopies{copied.recv_x,
                        {},
                        copied.recv_src_idx,
                        copied.recv_topk_idx,
                        copied.recv_topk_weights,
                        copied.num_recv_tokens_per_expert};
  const HtDispatchResult next = submit_together([&] {
    bench::hold_stream(stream, kHoldNs);
    buffer.copy_dispatch_outputs(to, HtStreams{stream});
    return buffer.dispatch(second.args, HtStreams{other});
  });
  ASSERT_NO_FATAL_FAILURE(complete(team, other));
  ASSERT_NO_FATAL_FAILURE(complete(team, stream));
  check_dispatch(kCase, rank, copied, expected[0].dispatch.recv[rank], N);
  check_dispatch(kCase, rank, next, expected[1].dispatch.recv[rank], expected[1].dispatch.recv[rank].num_recv_tokens);
  cudaStreamDestroy(other);
}

std::vector<Expected> expected_rounds(int R, int rounds) {
  std::vector<Expected> v;
  for (int i = 0; i < rounds; ++i) v.push_back(build_expected(kCase, R, 1000u + i));
  return v;
}

// Runs `round` on the parameter's ranks (0: one process per GPU, two at least; n: n ranks on one GPU) with
// `rounds` expected cases.
using ModeRound = void (*)(const std::vector<Expected>&, Team&, cudaStream_t);
void run_mode(int param, int rounds, ModeRound round) {
  if (param == 0) EPX_REQUIRE_WORLD_SIZE(2);
  const auto expected = expected_rounds(param == 0 ? rank_info().world_size : param, rounds);
  on_ranks(param, [&](Team& team, cudaStream_t stream) { round(expected, team, stream); });
}

class HtModes : public ::testing::TestWithParam<int> {};

TEST_P(HtModes, CommunicationStreamWithEvents) { run_mode(GetParam(), 1, async_round); }

TEST_P(HtModes, WorstCaseCapturedInAGraphAndReplayed) { run_mode(GetParam(), 3, graph_rounds); }

TEST_P(HtModes, CachedDispatchReturnsWithoutWaitingForItsKernel) { run_mode(GetParam(), 1, cached_without_host_wait); }

TEST_P(HtModes, CopiedOutputsAreOrderedBeforeTheNextDispatch) {
  run_mode(GetParam(), 2, copies_before_the_next_dispatch);
}

// Bad arguments are refused before anything is launched, with a message naming them; an invalid expert
// id (found on the device) fails the dispatch on every rank, naming the rank, token and slot.
TEST(HtValidation, BadArgumentsAndInvalidExpertIds) {
  const auto expected = expected_rounds(2, 1);
  on_single_gpu_team(2, TeamOptions{}, [&](Team& team, cudaStream_t stream) {
    const int rank = team.rank();
    RankInputs in = upload_inputs(kCase, expected[0].tokens[rank]);
    HtBuffer buffer(team, HtBufferOptions{kCase.T, kCase.H, kCase.K, kCase.E});
    const HtStreams on{stream};
    HtDispatchArgs a = in.args;
    a.x.type = ScalarType::float32;
    expect_error(ErrorKind::invalid_argument, {"x must be bf16 or fp8_e4m3"}, [&] { buffer.dispatch(a, on); });
    a = in.args;
    a.x.cols = 100;
    expect_error(ErrorKind::invalid_argument, {"multiple of 128"}, [&] { buffer.dispatch(a, on); });
    // More tokens than the buffer holds, on rank 1 only: it still takes part, with none, so both ranks
    // fail this dispatch at once (rank 0 names rank 1) and the next one works.
    a = in.args;
    if (rank == 1) a.topk_idx.rows = a.topk_weights.rows = a.x.rows = kCase.T + 1;
    const auto start = std::chrono::steady_clock::now();
    expect_error(ErrorKind::invalid_argument,
                 {rank == 1 ? std::string("more than the buffer's max_tokens_per_rank")
                            : std::string("rank 1 passed an invalid input")},
                 [&] { submit_together([&] { buffer.dispatch(a, on); }); });
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2)) << "rank " << rank;
    EXPECT_FALSE(team.failed()) << "rank " << rank;
    const HtDispatchResult next = submit_together([&] { return buffer.dispatch(in.args, on); });
    ASSERT_NO_FATAL_FAILURE(complete(team, stream));
    check_dispatch(kCase, rank, next, expected[0].dispatch.recv[rank], expected[0].dispatch.recv[rank].num_recv_tokens);
    a = in.args;
    a.x_scales = a.topk_weights;
    expect_error(ErrorKind::invalid_argument, {"x_scales is given but x is bf16"}, [&] { buffer.dispatch(a, on); });
    a = in.args;
    a.num_worst_tokens = 2 * kCase.T + 1;
    expect_error(ErrorKind::invalid_argument, {"num_worst_tokens"}, [&] { buffer.dispatch(a, on); });
    a = in.args;
    a.x.data = static_cast<char*>(a.x.data) + 2;
    expect_error(ErrorKind::invalid_argument, {"16-byte aligned"}, [&] { buffer.dispatch(a, on); });
    EXPECT_THROW(HtBuffer(team, HtBufferOptions{kCase.T, kCase.H, kCase.K, 63}), Error);  // E % R != 0

    // Rank 1's token 5 names expert E: both ranks' dispatches fail, naming it.
    if (rank == 1) {
      const int64_t bad = kCase.E;
      copy_host_to_device(static_cast<int64_t*>(in.args.topk_idx.data) + 5 * kCase.K + 2, &bad, sizeof(bad));
    }
    expect_error(ErrorKind::invalid_argument,
                 {rank == 1 ? "topk_idx[5][2] = " + std::to_string(kCase.E) : std::string("rank 1 passed")},
                 [&] { submit_together([&] { buffer.dispatch(in.args, on); }); });
  });
}

// A buffer made without its own combine output is that much smaller, and its combines write where the
// caller says: without `out`, or with an `out` (or a second bias) of another shape, they are refused
// before any launch.
TEST(HtValidation, CombineIntoTheCallersOutput) {
  const auto expected = expected_rounds(2, 1);
  on_single_gpu_team(2, TeamOptions{}, [&](Team& team, cudaStream_t stream) {
    const int rank = team.rank();
    const Expected& x = expected[0];
    RankInputs in = upload_inputs(kCase, x.tokens[rank]);
    const int64_t N = x.dispatch.recv[rank].num_recv_tokens;
    CombineInputs combine = upload_combine_inputs(kCase, x, rank, N, kCase.H, kCase.K);
    DeviceArray out(std::size_t(kCase.T + 1) * kCase.H * 2), out_weights(std::size_t(kCase.T) * kCase.K * 4);
    HtBufferOptions options{kCase.T, kCase.H, kCase.K, kCase.E};
    const std::size_t with_output = HtBuffer::required_bytes(options, team.size());
    options.combine_output = false;
    EXPECT_EQ(with_output - HtBuffer::required_bytes(options, team.size()), std::size_t(kCase.T) * kCase.H * 2);
    HtBuffer buffer(team, options);
    const HtDispatchResult d = submit_together([&] { return buffer.dispatch(in.args, HtStreams{stream}); });
    ASSERT_NO_FATAL_FAILURE(complete(team, stream));

    const HtStreams on{stream};
    HtCombineArgs a = combine.args;
    a.handle = d.handle;
    expect_error(ErrorKind::invalid_argument, {"out is needed"}, [&] { buffer.combine(a, on); });
    a.out = TensorRef{out.data, ScalarType::bf16, kCase.T, kCase.H, kCase.H + 8, 1};
    expect_error(ErrorKind::invalid_argument, {"out must have row stride H"}, [&] { buffer.combine(a, on); });
    a.out = TensorRef::matrix(out.data, ScalarType::bf16, kCase.T - 1, kCase.H);
    expect_error(ErrorKind::invalid_argument, {"out must have " + std::to_string(kCase.T) + " rows"},
                 [&] { buffer.combine(a, on); });
    a.out = TensorRef::matrix(out.data, ScalarType::bf16, kCase.T, kCase.H);
    a.out_weights = TensorRef::matrix(out_weights.data, ScalarType::float32, kCase.T, kCase.K);
    HtCombineArgs unweighted = a;
    unweighted.topk_weights = {};
    expect_error(ErrorKind::invalid_argument, {"out_weights is given, topk_weights is not"},
                 [&] { buffer.combine(unweighted, on); });
    HtCombineArgs short_bias = a;
    short_bias.second_bias = TensorRef::matrix(out.data, ScalarType::bf16, kCase.T - 1, kCase.H);
    expect_error(ErrorKind::invalid_argument, {"second_bias must have " + std::to_string(kCase.T) + " rows"},
                 [&] { buffer.combine(short_bias, on); });

    const HtCombineResult c = submit_together([&] { return buffer.combine(a, on); });
    ASSERT_NO_FATAL_FAILURE(complete(team, stream));
    EXPECT_EQ(c.x.data, out.data);
    EXPECT_EQ(c.topk_weights.data, out_weights.data);
    check_combine(kCase, rank, c, x.combine[rank]);
  });
}

// A rank that never joins the dispatch: the other gives up within the team's timeout with an error
// that names the phase and the absent rank, and its buffer and team can still be destroyed.
TEST(HtTimeout, AbsentPeerIsNamed) {
  const auto expected = expected_rounds(2, 1);
  on_single_gpu_team(2, TeamOptions{std::chrono::milliseconds(300)}, [&](Team& team, cudaStream_t stream) {
    RankInputs in = upload_inputs(kCase, expected[0].tokens[team.rank()]);
    HtBuffer buffer(team, HtBufferOptions{kCase.T, kCase.H, kCase.K, kCase.E});
    if (team.rank() == 1) return;  // rank 1 is "dead" (returning, it leaves the meetings)
    expect_error(ErrorKind::timeout, {"HT dispatch count exchange", "waiting for rank 1"},
                 [&] { submit_together([&] { buffer.dispatch(in.args, HtStreams{stream}); }); });
    EXPECT_TRUE(team.failed());
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  });
}

// 0: one process per GPU; 4: four ranks on one GPU.
INSTANTIATE_TEST_SUITE_P(Teams, HtModes, ::testing::Values(0, 4), [](const ::testing::TestParamInfo<int>& i) {
  return i.param == 0 ? std::string("World") : "SingleGpu" + std::to_string(i.param);
});

}  // namespace
}  // namespace epx::test
