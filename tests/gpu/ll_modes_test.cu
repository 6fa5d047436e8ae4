// LL calls in the ways users run them besides one plain call: captured once into a CUDA graph and
// replayed with new inputs; several calls in one graph; a thousand calls in a row; split into send and receive steps,
// two in flight; on the buffer's communication stream with events; with cumulative receive counters; with y in the
// buffer's own combine area; with some ranks' weights given to combine; with wait statistics. Then what must fail, and
// how: bad arguments (refused before any launch, naming the argument), an invalid expert id (reported by check_errors,
// counted as -1 meanwhile), a peer that never calls (a timeout naming the phase and the peer).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <initializer_list>
#include <string>
#include <thread>
#include <vector>

#include "bench/hold_stream.hpp"
#include "bench/timing.hpp"
#include "core/cuda_check.hpp"
#include "epx/ll.hpp"
#include "expect_error.hpp"
#include "gpu_test_env.hpp"
#include "ll_fixture.hpp"
#include "single_gpu_ranks.hpp"

namespace epx::test {
namespace {

constexpr uint32_t kSeed = 4000;

// One rank's buffer, the inputs of `sets` different seeds and one output set per input set.
struct Rig {
  LlCase c;
  std::vector<LlExpected> x;
  LlBuffer buffer;
  std::vector<LlRankInputs> in;
  std::vector<LlOutputs> out;

  Rig(const LlCase& the_case, Team& team, int sets, uint32_t seed = kSeed)
      : c(the_case), x(expected_sets(the_case, team.size(), sets, seed)), buffer(team, ll_buffer_options(c, x[0])) {
    for (int i = 0; i < sets; ++i) {
      in.push_back(upload_ll_inputs(c, x[i], team.rank()));
      out.push_back(allocate_ll_outputs(c, x[i], buffer));
    }
  }
  static std::vector<LlExpected> expected_sets(const LlCase& c, int R, int sets, uint32_t seed) {
    std::vector<LlExpected> v;
    for (int i = 0; i < sets; ++i) v.push_back(build_ll_expected(c, R, seed + uint32_t(i)));
    return v;
  }
  LlDispatchArgs dispatch_args(int set) const { return ll_dispatch_args(c, in[set], out[set]); }
  // Every call goes to the buffer together with the other ranks' (submit_together).
  LlDispatchResult dispatch(const LlDispatchArgs& args, const Streams& on) {
    return submit_together([&] { return buffer.dispatch(args, on); });
  }
  LlCombineResult combine(const LlCombineArgs& args, const Streams& on) {
    return submit_together([&] { return buffer.combine(args, on); });
  }
  LlCombineArgs combine_args(int set, const LlHandle& handle, LlCombineOrder order) const {
    return ll_combine_args(c, x[set], in[set], out[set], handle, order);
  }
  // Input set `set`'s dispatch weights, as a tensor.
  TensorRef dispatch_weights(int set) const {
    return TensorRef::matrix(in[set].dispatch_weights->data, ScalarType::float32, c.T, c.K);
  }
};

void sync_and_check_errors(LlBuffer& buffer, cudaStream_t stream) {
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  buffer.check_errors();
}

// (1) dispatch + combine captured once; each replay gets new inputs written into the captured input
// arrays, and its outputs are checked.
void graph_replays(const LlCase& c, Team& team, cudaStream_t stream) {
  constexpr int kReplays = 100;
  const int rank = team.rank();
  Rig rig(c, team, 1);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const LlDispatchResult d = rig.buffer.dispatch(rig.dispatch_args(0), Streams{stream});
  rig.buffer.combine(rig.combine_args(0, d.handle, LlCombineOrder::local), Streams{stream});
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int i = 0; i < kReplays && !::testing::Test::HasFailure(); ++i) {
    const LlExpected x = build_ll_expected(c, team.size(), kSeed + 100 + uint32_t(i));
    write_ll_inputs(c, x, rank, rig.in[0]);
    poison_ll_outputs(rig.out[0], stream);
    // One launch of two kernels that wait for each other inside the graph (passed on one queue).
    submit_together([&] { ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess); });
    sync_and_check_errors(rig.buffer, stream);
    SCOPED_TRACE("replay " + std::to_string(i));
    check_ll_dispatch(c, x, rank, rig.out[0]);
    check_ll_combine(c, x, rank, rig.out[0], LlCombineOrder::local);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// (1b) Several calls in one graph, as a caller's step holds them and the bench times them: dispatch + combine
// on each of three input sets (the combines in local, naive, local order), captured together, so the calls
// alternate the buffer sets within the graph (A, B, A) and each kernel starts as the one before it exits
// (programmatic dependents); replayed with new inputs, every call's outputs checked.
void calls_in_one_graph(const LlCase& c, Team& team, cudaStream_t stream) {
  constexpr int kReplays = 10, kSets = 3;
  const int rank = team.rank();
  Rig rig(c, team, kSets);
  const auto order_of = [](int set) { return set == 1 ? LlCombineOrder::naive : LlCombineOrder::local; };
  const bench::GraphExec calls = bench::capture_graph(stream, [&](cudaStream_t s) {
    for (int set = 0; set < kSets; ++set) {
      const LlDispatchResult d = rig.buffer.dispatch(rig.dispatch_args(set), Streams{s});
      rig.buffer.combine(rig.combine_args(set, d.handle, order_of(set)), Streams{s});
    }
  });
  for (int i = 0; i < kReplays && !::testing::Test::HasFailure(); ++i) {
    std::vector<LlExpected> x;
    for (int set = 0; set < kSets; ++set) {
      x.push_back(build_ll_expected(c, team.size(), kSeed + 200 + uint32_t(kSets * i + set)));
      write_ll_inputs(c, x.back(), rank, rig.in[std::size_t(set)]);
      poison_ll_outputs(rig.out[std::size_t(set)], stream);
    }
    submit_together([&] { bench::launch_graph(calls, stream); });
    sync_and_check_errors(rig.buffer, stream);
    for (int set = 0; set < kSets; ++set) {
      SCOPED_TRACE("replay " + std::to_string(i) + ", call " + std::to_string(set));
      check_ll_dispatch(c, x[std::size_t(set)], rank, rig.out[std::size_t(set)]);
      check_ll_combine(c, x[std::size_t(set)], rank, rig.out[std::size_t(set)], order_of(set));
    }
  }
}

// (2) 1000 dispatch + combine pairs: three input sets in turn, both combine orders on both buffer
// sets. Every combine is checked, every 7th dispatch (an odd period, so both buffer sets).
void repeated_calls(const LlCase& c, Team& team, cudaStream_t stream) {
  constexpr int kCalls = 1000, kSets = 3;
  const int rank = team.rank();
  Rig rig(c, team, kSets);
  for (int i = 0; i < kCalls && !::testing::Test::HasFailure(); ++i) {
    const int set = i % kSets;
    const LlCombineOrder order = (i / 2) % 2 == 0 ? LlCombineOrder::local : LlCombineOrder::naive;
    poison_ll_outputs(rig.out[set], stream);
    const LlDispatchResult d = rig.dispatch(rig.dispatch_args(set), Streams{stream});
    rig.combine(rig.combine_args(set, d.handle, order), Streams{stream});
    sync_and_check_errors(rig.buffer, stream);
    SCOPED_TRACE("call " + std::to_string(i));
    check_ll_combine(c, rig.x[set], rank, rig.out[set], order);
    if (i % 7 == 0) check_ll_dispatch(c, rig.x[set], rank, rig.out[set]);
  }
}

// (3) send_only: one dispatch and one combine split in two; then two dispatches in flight.
void split_calls(const LlCase& c, Team& team, cudaStream_t stream) {
  const int rank = team.rank();
  Rig rig(c, team, 2);
  const Streams on{stream};
  LlDispatchArgs a = rig.dispatch_args(0);
  a.send_only = true;
  poison_ll_outputs(rig.out[0], stream);
  const LlDispatchResult d = rig.dispatch(a, on);
  ASSERT_TRUE(d.receive) << "rank " << rank << ": send_only dispatch returned no receive step";
  submit_together([&] { d.receive(); });
  sync_and_check_errors(rig.buffer, stream);
  check_ll_dispatch(c, rig.x[0], rank, rig.out[0]);
  LlCombineArgs ca = rig.combine_args(0, d.handle, LlCombineOrder::local);
  ca.send_only = true;
  const LlCombineResult r = rig.combine(ca, on);
  ASSERT_TRUE(r.receive) << "rank " << rank << ": send_only combine returned no receive step";
  submit_together([&] { r.receive(); });
  sync_and_check_errors(rig.buffer, stream);
  check_ll_combine(c, rig.x[0], rank, rig.out[0], LlCombineOrder::local);

  // send A, send B, receive A, receive B, combine A, combine B.
  for (int set = 0; set < 2; ++set) poison_ll_outputs(rig.out[set], stream);
  std::vector<LlDispatchResult> sent;
  for (int set = 0; set < 2; ++set) {
    LlDispatchArgs args = rig.dispatch_args(set);
    args.send_only = true;
    sent.push_back(rig.dispatch(args, on));
    ASSERT_TRUE(sent.back().receive) << "rank " << rank;
  }
  for (const LlDispatchResult& s : sent) submit_together([&] { s.receive(); });
  rig.combine(rig.combine_args(0, sent[0].handle, LlCombineOrder::local), on);
  rig.combine(rig.combine_args(1, sent[1].handle, LlCombineOrder::naive), on);
  sync_and_check_errors(rig.buffer, stream);
  for (int set = 0; set < 2; ++set) check_ll_dispatch(c, rig.x[set], rank, rig.out[set]);
  check_ll_combine(c, rig.x[0], rank, rig.out[0], LlCombineOrder::local);
  check_ll_combine(c, rig.x[1], rank, rig.out[1], LlCombineOrder::naive);
}

// (4) Streams::async: the calls run on the buffer's stream after `before`, the caller waits on `finished`.
void async_calls(const LlCase& c, Team& team, cudaStream_t stream) {
  const int rank = team.rank();
  Rig rig(c, team, 1);
  cudaEvent_t before;
  ASSERT_EQ(cudaEventCreateWithFlags(&before, cudaEventDisableTiming), cudaSuccess);
  poison_ll_outputs(rig.out[0], stream);
  ASSERT_EQ(cudaEventRecord(before, stream), cudaSuccess);
  const LlDispatchResult d = rig.dispatch(rig.dispatch_args(0), Streams{stream, true, before});
  ASSERT_NE(d.finished, nullptr);
  ASSERT_EQ(cudaStreamWaitEvent(stream, d.finished, 0), cudaSuccess);
  sync_and_check_errors(rig.buffer, stream);
  check_ll_dispatch(c, rig.x[0], rank, rig.out[0]);
  const LlCombineResult r =
      rig.combine(rig.combine_args(0, d.handle, LlCombineOrder::naive), Streams{stream, true, nullptr});
  ASSERT_NE(r.finished, nullptr);
  ASSERT_EQ(cudaStreamWaitEvent(stream, r.finished, 0), cudaSuccess);
  sync_and_check_errors(rig.buffer, stream);
  check_ll_combine(c, rig.x[0], rank, rig.out[0], LlCombineOrder::naive);
  cudaEventDestroy(before);
  cudaEventDestroy(d.finished);
  cudaEventDestroy(r.finished);
}

// (5) cumulative_recv_count adds each call's counts; a call without it adds nothing.
void cumulative_counts(const LlCase& c, Team& team, cudaStream_t stream) {
  constexpr int kCalls = 3;
  const int rank = team.rank();
  Rig rig(c, team, kCalls);
  const int n = rig.x[0].E_local;
  DeviceArray counter(std::size_t(n) * 4);
  ASSERT_EQ(cudaMemset(counter.data, 0, std::size_t(n) * 4), cudaSuccess);
  std::vector<int32_t> want(std::size_t(n), 0);
  for (int i = 0; i < kCalls; ++i) {
    const bool counted = i != 1;
    LlDispatchArgs a = rig.dispatch_args(i);
    if (counted) a.cumulative_recv_count = static_cast<int32_t*>(counter.data);
    rig.dispatch(a, Streams{stream});
    sync_and_check_errors(rig.buffer, stream);
    for (int e = 0; e < n && counted; ++e) want[std::size_t(e)] += rig.x[i].recv[rank].recv_count[std::size_t(e)];
    std::vector<int32_t> got(want.size());
    copy_from_device(got, counter.data);
    EXPECT_EQ(got, want) << "rank " << rank << ": cumulative receive counts after call " << i;
  }
}

// (6) y written into combine_buffer(), which the buffer allocates on the first call.
void combine_from_buffer(const LlCase& c, Team& team, cudaStream_t stream) {
  const int rank = team.rank();
  Rig rig(c, team, 1);
  const LlExpected& x = rig.x[0];
  const std::size_t before = rig.buffer.buffer_bytes();
  const TensorRef y = rig.buffer.combine_buffer();
  ASSERT_NE(y.data, nullptr);
  ASSERT_EQ(y.type, ScalarType::bf16);
  ASSERT_EQ(y.rows, int64_t(x.E_local) * x.C);
  ASSERT_GE(y.cols, c.H);
  EXPECT_GE(rig.buffer.buffer_bytes(), before + std::size_t(y.rows) * y.cols * 2)
      << "rank " << rank << ": buffer_bytes() does not count combine_buffer()";
  poison_ll_outputs(rig.out[0], stream);
  // The expert outputs go in before the calls (a copy, which may run on a copy engine: see
  // submit_together); nothing but combine reads or writes combine_buffer().
  ASSERT_EQ(cudaMemcpy2DAsync(y.data, y.row_stride * 2, rig.in[0].y->data, c.H * 2, c.H * 2, y.rows,
                              cudaMemcpyDeviceToDevice, stream),
            cudaSuccess);
  const LlDispatchResult d = rig.dispatch(rig.dispatch_args(0), Streams{stream});
  LlCombineArgs a = rig.combine_args(0, d.handle, LlCombineOrder::local);
  a.y = TensorRef{y.data, ScalarType::bf16, y.rows, c.H, y.row_stride, 1};
  rig.combine(a, Streams{stream});
  sync_and_check_errors(rig.buffer, stream);
  check_ll_combine(c, x, rank, rig.out[0], LlCombineOrder::local);
}

// (7) The home ranks' weights given to combine, on half the ranks: odd ranks give theirs to combine
// (their dispatch has none), even ranks to dispatch, so an expert side takes some messages' weights
// from the dispatch and awaits the others'. Six calls over three input sets, so that each buffer set
// holds other weights from its previous use; every other call as send and receive steps (where a
// rank's messages to itself take its weights through the buffer set too). The odd ranks start each
// combine 1 ms late (a kernel holds their stream), so the others' expert sides find the previous use's
// weights there first and must wait for this call's (on one hardware queue the hold may delay every
// rank alike: the test still holds, it then just waits less).
void weights_given_to_combine(const LlCase& c, Team& team, cudaStream_t stream) {
  bench::load_hold_kernel();
  constexpr int kCalls = 6, kSets = 3;
  const int rank = team.rank();
  const bool given_here = rank % 2 == 1;
  Rig rig(c, team, kSets);
  for (int i = 0; i < kCalls; ++i) {
    const int set = i % kSets;
    SCOPED_TRACE("call " + std::to_string(i));
    poison_ll_outputs(rig.out[set], stream);
    LlDispatchArgs a = rig.dispatch_args(set);
    if (given_here) a.topk_weights = TensorRef{};
    const LlDispatchResult d = rig.dispatch(a, Streams{stream});
    EXPECT_EQ(d.handle.has_weights, !given_here) << "rank " << rank;
    // The same values as the dispatch weights the reference's local order uses.
    LlCombineArgs ca = rig.combine_args(set, d.handle, LlCombineOrder::local);
    if (given_here) ca.topk_weights = rig.dispatch_weights(set);
    ca.send_only = i % 2 == 1;
    const LlCombineResult r = submit_together([&] {
      if (given_here) bench::hold_stream(stream, 1'000'000);
      return rig.buffer.combine(ca, Streams{stream});
    });
    if (ca.send_only) {
      ASSERT_TRUE(r.receive) << "rank " << rank;
      submit_together([&] { r.receive(); });
    }
    sync_and_check_errors(rig.buffer, stream);
    check_ll_dispatch(c, rig.x[set], rank, rig.out[set]);
    check_ll_combine(c, rig.x[set], rank, rig.out[set], LlCombineOrder::local);
  }
}

// (8) cumulative_wait_cycles: rank 1 comes 20 ms late to a dispatch and to a combine (a kernel holds its
// stream first), so every other rank's waits for rank 1's data add up to tens of millions of cycles in
// entry 1, and the entries of the ranks that came in time stay far below that: every warp that waits
// adds its own cycles, so those entries sum the microseconds by which the ranks' calls started apart
// over the warps that waited (10.1 million cycles in one entry at EP=4 on 4 GPUs, 2026-11-28), while
// each warp that waited for rank 1 adds ~20 ms. Not part of LlModes: on one hardware queue the held
// stream would hold back every rank's calls.
void late_rank_stands_out(Team& team, cudaStream_t stream) {
  constexpr uint64_t kLateNs = 20'000'000;
  constexpr int64_t kLateCycles = 10'000'000;  // half of 20 ms at 1 GHz, for one waiting warp alone
  constexpr int64_t kStandsOut = 4;            // entry 1 against any other entry of a rank that waited for it
  const LlCase c = ll_small_case(team.is_single_gpu() ? team.size() : 0);
  const int rank = team.rank(), R = team.size();
  bench::load_hold_kernel();
  Rig rig(c, team, 1);
  const std::size_t bytes = sizeof(int64_t) * std::size_t(R);
  DeviceArray dispatch_waits(bytes), combine_waits(bytes);
  ASSERT_EQ(cudaMemsetAsync(dispatch_waits.data, 0, bytes, stream), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(combine_waits.data, 0, bytes, stream), cudaSuccess);
  poison_ll_outputs(rig.out[0], stream);
  const auto late = [&] {
    if (rank == 1) bench::hold_stream(stream, kLateNs);
  };
  LlDispatchArgs a = rig.dispatch_args(0);
  a.cumulative_wait_cycles = static_cast<int64_t*>(dispatch_waits.data);
  const LlDispatchResult d = submit_together([&] {
    late();
    return rig.buffer.dispatch(a, Streams{stream});
  });
  sync_and_check_errors(rig.buffer, stream);
  check_ll_dispatch(c, rig.x[0], rank, rig.out[0]);
  LlCombineArgs ca = rig.combine_args(0, d.handle, LlCombineOrder::local);
  ca.cumulative_wait_cycles = static_cast<int64_t*>(combine_waits.data);
  submit_together([&] {
    late();
    rig.buffer.combine(ca, Streams{stream});
  });
  sync_and_check_errors(rig.buffer, stream);
  check_ll_combine(c, rig.x[0], rank, rig.out[0], LlCombineOrder::local);
  for (const DeviceArray* counter : {&dispatch_waits, &combine_waits}) {
    std::vector<int64_t> waits(bytes / sizeof(int64_t));
    copy_from_device(waits, counter->data);
    const std::string what = std::string(counter == &dispatch_waits ? "dispatch" : "combine") +
                             " wait cycles of rank " + std::to_string(rank) + " (rank 1 late)";
    for (int r = 0; r < R; ++r) {
      EXPECT_GE(waits[std::size_t(r)], 0) << what << ", entry " << r;
      if (rank == 1) {
        EXPECT_LT(waits[std::size_t(r)], kLateCycles) << what << ", entry " << r;  // everyone's data was there
      } else if (r == 1) {
        EXPECT_GE(waits[1], kLateCycles) << what;
      } else {
        EXPECT_LT(waits[std::size_t(r)] * kStandsOut, waits[1]) << what << ", entry " << r;
      }
    }
  }
}

TEST(LlWaitCycles, LateRankStandsOutOnSingleGpuTeam) { on_ranks(2, late_rank_stands_out); }

TEST(LlWaitCycles, LateRankStandsOutOnWorldTeam) {
  EPX_REQUIRE_WORLD_SIZE(2);
  on_ranks(0, late_rank_stands_out);
}

class LlModes : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (GetParam() == 0) EPX_REQUIRE_WORLD_SIZE(2);
  }
  void run(void (*body)(const LlCase&, Team&, cudaStream_t)) {
    const LlCase c = ll_small_case(GetParam());
    on_ranks(GetParam(), [&](Team& team, cudaStream_t stream) { body(c, team, stream); });
  }
};

TEST_P(LlModes, GraphCapturedOnceAndReplayedWithNewInputs) { run(graph_replays); }

TEST_P(LlModes, SeveralCallsInOneGraph) { run(calls_in_one_graph); }

TEST_P(LlModes, ThousandCallsAlternatingBufferSets) { run(repeated_calls); }

TEST_P(LlModes, SendOnlyThenReceiveTwoInFlight) { run(split_calls); }

TEST_P(LlModes, CommunicationStreamWithEvents) { run(async_calls); }

TEST_P(LlModes, CumulativeReceiveCounts) { run(cumulative_counts); }

TEST_P(LlModes, CombineReadsYFromCombineBuffer) { run(combine_from_buffer); }

TEST_P(LlModes, LocalOrderWithWeightsGivenToCombine) { run(weights_given_to_combine); }

// 0: one process per GPU; 4: four ranks on one GPU.
INSTANTIATE_TEST_SUITE_P(Teams, LlModes, ::testing::Values(0, 4), [](const ::testing::TestParamInfo<int>& i) {
  return i.param == 0 ? std::string("World") : "SingleGpu" + std::to_string(i.param);
});

// (9) A bad argument throws epx::Error (invalid_argument) before anything is launched, with a message
// holding every one of its words (expect_error).

void refuse_bad_dispatch_arguments(Rig& rig, const Streams& on, int rank) {
  const LlCase& c = rig.c;
  const LlDispatchArgs good = rig.dispatch_args(0);
  const auto refused = [&](const std::function<void(LlDispatchArgs&)>& edit, std::initializer_list<std::string> words) {
    LlDispatchArgs a = good;
    edit(a);
    expect_error(
        ErrorKind::invalid_argument, words, [&] { rig.buffer.dispatch(a, on); }, "rank " + std::to_string(rank));
  };
  refused([&](LlDispatchArgs& a) { a.x.rows = a.topk_idx.rows = a.topk_weights.rows = c.T_max + 1; },
          {"max_tokens_per_rank"});
  refused([](LlDispatchArgs& a) { a.x.cols = a.x.row_stride = 200; }, {"multiple of 128"});
  refused([&](LlDispatchArgs& a) { a.x.cols = a.x.row_stride = c.H + 128; }, {"hidden"});
  refused(
      [](LlDispatchArgs& a) {
        a.x.cols = a.x.row_stride = 384;
        a.round_scale = a.use_ue8m0 = true;
      },
      {"512"});
  refused([](LlDispatchArgs& a) { a.use_ue8m0 = true; }, {"round_scale"});
  refused(
      [](LlDispatchArgs& a) {
        a.use_fp8 = false;
        a.round_scale = true;
      },
      {"use_fp8"});
  refused(
      [&](LlDispatchArgs& a) {
        a.topk_idx.cols = a.topk_idx.row_stride = c.K + 1;
        a.topk_weights.cols = a.topk_weights.row_stride = c.K + 1;
      },
      {"topk_idx"});
  refused([](LlDispatchArgs& a) { a.x.type = ScalarType::float32; }, {"x must be", "bf16"});
  refused([](LlDispatchArgs& a) { a.topk_idx.type = ScalarType::float32; }, {"topk_idx"});
  refused([](LlDispatchArgs& a) { a.topk_weights.type = ScalarType::bf16; }, {"topk_weights"});
  refused([](LlDispatchArgs& a) { a.out.x = nullptr; }, {"out.x"});
  refused([](LlDispatchArgs& a) { a.out.scales = nullptr; }, {"out.scales"});
  refused([](LlDispatchArgs& a) { a.out.recv_count = nullptr; }, {"out.recv_count"});
  refused([](LlDispatchArgs& a) { a.out.src_idx = nullptr; }, {"out.src_idx"});
  refused([](LlDispatchArgs& a) { a.out.layout_range = nullptr; }, {"out.layout_range"});
  refused([](LlDispatchArgs& a) { a.x.data = static_cast<char*>(a.x.data) + 2; }, {"x", "aligned"});
  refused([](LlDispatchArgs& a) { a.out.x = static_cast<char*>(a.out.x) + 8; }, {"out.x", "aligned"});
  refused([](LlDispatchArgs& a) { a.cumulative_wait_cycles = reinterpret_cast<int64_t*>(4); },
          {"cumulative_wait_cycles", "aligned"});
}

void refuse_bad_combine_arguments(Rig& rig, const Streams& on, int rank) {
  // Three dispatches: the first one's set is reused by the third, so its handle is stale.
  std::vector<LlDispatchResult> d;
  for (int i = 0; i < 3; ++i) d.push_back(rig.dispatch(rig.dispatch_args(0), on));
  LlDispatchArgs unweighted = rig.dispatch_args(0);
  unweighted.topk_weights = TensorRef{};
  const LlDispatchResult no_weights = rig.dispatch(unweighted, on);  // reuses the second's set
  ASSERT_EQ(cudaStreamSynchronize(on.stream), cudaSuccess);
  rig.buffer.check_errors();

  const LlCombineArgs good = rig.combine_args(0, d[2].handle, LlCombineOrder::naive);
  const auto refused = [&](const std::function<void(LlCombineArgs&)>& edit, std::initializer_list<std::string> words) {
    LlCombineArgs a = good;
    edit(a);
    expect_error(
        ErrorKind::invalid_argument, words, [&] { rig.buffer.combine(a, on); }, "rank " + std::to_string(rank));
  };
  refused([&](LlCombineArgs& a) { a.handle = d[0].handle; }, {"handle"});
  refused([&](LlCombineArgs& a) { a.handle.buffer = &rig; }, {"handle"});
  refused([&](LlCombineArgs& a) { a.handle.set = 2; }, {"handle", "buffer set 2", "altered"});
  refused([&](LlCombineArgs& a) { a.handle.has_weights = false; }, {"handle", "has_weights", "as it was"});
  refused([&](LlCombineArgs& a) { a.handle.num_tokens -= 1; }, {"handle", "num_tokens", "as it was"});
  refused(
      [&](LlCombineArgs& a) {
        a.handle = no_weights.handle;
        a.order = LlCombineOrder::local;
        a.topk_weights = TensorRef{};
      },
      {"local", "weights"});
  refused(
      [&](LlCombineArgs& a) {
        a.handle = no_weights.handle;
        a.order = LlCombineOrder::local;
        a.topk_weights.cols = a.topk_weights.row_stride = rig.c.K + 1;
      },
      {"topk_weights"});
  refused([](LlCombineArgs& a) { a.order = LlCombineOrder::local; }, {"local", "dispatch had topk_weights"});
  refused(
      [&](LlCombineArgs& a) {
        a.handle = no_weights.handle;
        a.topk_weights = TensorRef{};
      },
      {"naive", "weights"});
  refused([](LlCombineArgs& a) { a.y.type = ScalarType::float32; }, {"y must be", "bf16"});
  refused([](LlCombineArgs& a) { a.y.data = static_cast<char*>(a.y.data) + 2; }, {"y", "aligned"});
  refused([](LlCombineArgs& a) { a.y.row_stride = int64_t(1) << 31; }, {"y's row stride", "2^31"});
  refused([](LlCombineArgs& a) { a.out.type = ScalarType::float32; }, {"out must be", "bf16"});
  refused([](LlCombineArgs& a) { a.out.data = nullptr; }, {"out", "null"});
  refused([](LlCombineArgs& a) { a.out.data = static_cast<char*>(a.out.data) + 2; }, {"out", "aligned"});
  refused([](LlCombineArgs& a) { a.cumulative_wait_cycles = reinterpret_cast<int64_t*>(4); },
          {"cumulative_wait_cycles", "aligned"});
}

TEST(LlValidation, BadArgumentsAreRefusedBeforeLaunch) {
  const LlCase c = ll_small_case(2);
  on_single_gpu_team(2, TeamOptions{}, [&](Team& team, cudaStream_t stream) {
    const int rank = team.rank();
    Rig rig(c, team, 1);
    const Streams on{stream};
    refuse_bad_dispatch_arguments(rig, on, rank);
    refuse_bad_combine_arguments(rig, on, rank);

    // Nothing refused was launched: the ranks still meet, and a good call gives the reference's results.
    poison_ll_outputs(rig.out[0], stream);
    const LlDispatchResult d = rig.dispatch(rig.dispatch_args(0), on);
    rig.combine(rig.combine_args(0, d.handle, LlCombineOrder::local), on);
    sync_and_check_errors(rig.buffer, stream);
    check_ll_dispatch(c, rig.x[0], rank, rig.out[0]);
    check_ll_combine(c, rig.x[0], rank, rig.out[0], LlCombineOrder::local);

    // A rank with no tokens gives no weights, in either order (from Python a [0][K] tensor comes with no
    // data pointer): accepted, and the calls run.
    LlDispatchArgs no_tokens = rig.dispatch_args(0);
    no_tokens.x.rows = no_tokens.topk_idx.rows = 0;
    no_tokens.topk_weights = TensorRef{};
    const LlDispatchResult empty = rig.dispatch(no_tokens, on);
    for (const LlCombineOrder order : kLlOrders) {
      LlCombineArgs a = rig.combine_args(0, empty.handle, order);
      a.topk_weights = TensorRef{};
      a.out.rows = 0;
      rig.combine(a, on);
    }
    sync_and_check_errors(rig.buffer, stream);

    // A send_only combine's receive step reads its handle's routing: once the dispatch two calls after
    // the handle's has reused that buffer set, the step is refused.
    const LlDispatchResult routed = rig.dispatch(rig.dispatch_args(0), on);
    LlCombineArgs sends = rig.combine_args(0, routed.handle, LlCombineOrder::local);
    sends.send_only = true;
    const LlCombineResult split = rig.combine(sends, on);
    ASSERT_TRUE(split.receive) << "rank " << rank;
    for (int i = 0; i < 2; ++i) rig.dispatch(rig.dispatch_args(0), on);
    expect_error(
        ErrorKind::invalid_argument, {"combine receive step", "dispatch", "reused"}, [&] { split.receive(); },
        "rank " + std::to_string(rank));
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);

    const LlBufferOptions good = ll_buffer_options(c, rig.x[0]);
    const auto refused = [&](const std::function<void(LlBufferOptions&)>& edit, const char* word) {
      LlBufferOptions o = good;
      edit(o);
      expect_error(
          ErrorKind::invalid_argument, {word}, [&] { const LlBuffer refused_buffer(team, o); },
          "rank " + std::to_string(rank));
    };
    refused([](LlBufferOptions& o) { o.num_experts = 33; }, "num_experts");  // not a multiple of 2 ranks
    refused([](LlBufferOptions& o) { o.max_topk = 17; }, "max_topk");
    refused([](LlBufferOptions& o) { o.hidden = 200; }, "hidden");
    refused([](LlBufferOptions& o) { o.hidden = 16384 + 128; }, "hidden");
  });
}

// (10) Rank 1's token 5 names `bad` in slot 0: the call goes on as if it were -1 (on the expert side
// and on rank 1 as home rank alike), and rank 1's check_errors names the token and slot.
TEST(LlErrors, InvalidExpertIdIsReportedAndCountsAsEmpty) {
  LlCase c = ll_small_case(2);
  c.p_empty = 0.0;  // slot 0 of token 5 names a real expert before the edit
  for (const int64_t bad : {int64_t(c.E), int64_t(-2)}) {
    LlExpected x = make_ll_inputs(c, 2, kSeed);
    x.tokens[1].topk_idx.at(5, 0) = -1;
    compute_ll_reference(c, x);
    on_single_gpu_team(2, TeamOptions{}, [&](Team& team, cudaStream_t stream) {
      const int rank = team.rank();
      SCOPED_TRACE("invalid id " + std::to_string(bad));
      LlBuffer buffer(team, ll_buffer_options(c, x));
      const LlRankInputs in = upload_ll_inputs(c, x, rank);
      const LlOutputs out = allocate_ll_outputs(c, x, buffer);
      if (rank == 1) {
        copy_host_to_device(static_cast<int64_t*>(in.topk_idx->data) + 5 * c.K, &bad, sizeof(bad));
      }
      ll_exchange_and_check(c, x, buffer, team, in, out, stream);
      try {
        buffer.check_errors();
        if (rank == 1) ADD_FAILURE() << "rank 1: check_errors reported nothing";
      } catch (const Error& e) {
        const std::string what = e.what();
        // Rank 0 may hear of it too; it must then name the rank that sent it.
        const std::string where = rank == 1 ? "topk_idx[5][0]" : "rank 1";
        EXPECT_NE(what.find(where), std::string::npos) << "rank " << rank << ": want '" << where << "' in: " << what;
      }
    });
  }
}

// (11) Rank 1 never calls: rank 0's dispatch waits at most the team's timeout, and check_errors (or, at
// the latest, the next call) reports a timeout naming the LL dispatch phase and rank 1.
TEST(LlTimeout, AbsentPeerIsNamed) {
  const LlCase c = ll_small_case(2);
  on_single_gpu_team(2, TeamOptions{std::chrono::milliseconds(300)}, [&](Team& team, cudaStream_t stream) {
    Rig rig(c, team, 1);
    if (team.rank() == 1) return;  // rank 1 is "dead"
    expect_error(ErrorKind::timeout, {"LL dispatch", "waiting for rank 1"}, [&] {
      rig.buffer.dispatch(rig.dispatch_args(0), Streams{stream});
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      rig.buffer.check_errors();
      rig.buffer.dispatch(rig.dispatch_args(0), Streams{stream});  // reports it at the latest
    });
    EXPECT_TRUE(team.failed());
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  });
}

// (12) Both ranks dispatch without weights, then rank 1 never combines: rank 0's combine sends (alone,
// send_only, so no receive wait competes) wait for rank 1's weights at most the team's timeout, and
// the report names the weights and rank 1. Rank 1 keeps its buffer until rank 0 is done.
TEST(LlTimeout, AbsentHomeRankOfTheWeightsIsNamed) {
  const LlCase c = ll_small_case(2);
  std::atomic<bool> done{false};
  struct ReleaseRankOne {
    std::atomic<bool>* done;  // null: not rank 0
    ~ReleaseRankOne() {
      if (done != nullptr) done->store(true);
    }
  };
  on_single_gpu_team(2, TeamOptions{std::chrono::milliseconds(300)}, [&](Team& team, cudaStream_t stream) {
    // Rank 0 lets rank 1 go on every way out, failed assertions included.
    const ReleaseRankOne release{team.rank() == 0 ? &done : nullptr};
    Rig rig(c, team, 1);
    LlDispatchArgs a = rig.dispatch_args(0);
    a.topk_weights = TensorRef{};
    const LlDispatchResult d = rig.dispatch(a, Streams{stream});
    sync_and_check_errors(rig.buffer, stream);
    if (team.rank() == 1) {  // makes no call from here on
      leave_rank_threads_meeting();
      while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return;
    }
    LlCombineArgs ca = rig.combine_args(0, d.handle, LlCombineOrder::local);
    ca.topk_weights = rig.dispatch_weights(0);
    ca.send_only = true;
    expect_error(ErrorKind::timeout, {"LL combine weights", "waiting for rank 1"}, [&] {
      rig.buffer.combine(ca, Streams{stream});
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      rig.buffer.check_errors();
    });
    EXPECT_TRUE(team.failed());
  });
}

}  // namespace
}  // namespace epx::test
