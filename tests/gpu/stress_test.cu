// Stress: thousands of HT and LL exchanges alternating on one team, each with a fresh routing and token
// count, every dispatch and every combine compared with the CPU reference as ht_test.cu and ll_test.cu
// compare them: bit for bit (LL's FP8 rows also against their input, within FP8's rounding). The
// routings cycle through uniform, Zipf (s = 1.2), every token to one expert (expert 0, top-1), every
// slot -1, and no tokens; T varies between 0 and T_max. HT alternates BF16 / FP8, LL cycles BF16 / FP8 /
// FP8 with power-of-two scales, both with int64 and int32 ids. One HtBuffer and one LlBuffer serve every
// iteration, so what a call leaves behind (flags, buffer sets, handle blocks, stale rows) must never
// show in a later one. Nothing is printed per iteration: the first difference is reported with its
// iteration, exchange, routing and what differed, and ends the test.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "epx/ht.hpp"
#include "epx/ll.hpp"
#include "gpu_test_env.hpp"
#include "ht_fixture.hpp"
#include "ll_fixture.hpp"
#include "routing_fixture.hpp"
#include "single_gpu_ranks.hpp"

namespace epx::test {
namespace {

constexpr uint32_t kSeed = 7000;

// Small shapes, so that the reference (which every rank computes for the whole team) keeps up with the
// GPU: H = 256 is a multiple of 128 (LL), E = 32 divides among 1, 2, 4, 8, 16 and 32 ranks.
constexpr int kTokensMax = 32, kHidden = 256, kTopk = 6, kExperts = 32;
constexpr int kWorldIterations = 10000;  // 5,000 HT and 5,000 LL exchanges, alternating
// A single-GPU team's process checks every rank's outputs (and builds the reference once for all of
// them), so it runs fewer iterations: 250 HT and 250 LL exchanges on 8 ranks.
constexpr int kSingleGpuRanks = 8, kSingleGpuIterations = 500;

enum class Kind { uniform, zipf, one_expert, all_empty, no_tokens };
constexpr int kKinds = 5;
constexpr const char* kKindNames[kKinds] = {"uniform", "zipf (s = 1.2)", "every token to expert 0 only",
                                            "every slot -1", "no tokens"};

constexpr LlPayload kLlPayloads[] = {LlPayload::bf16, LlPayload::fp8, LlPayload::fp8_round_scale};
constexpr const char* kLlPayloadNames[] = {"bf16", "fp8", "fp8 with power-of-two scales"};
constexpr int kLlPayloadCount = 3;

// One iteration: which exchange, its case and the whole team's inputs with the reference's outputs.
struct Iteration {
  bool is_ht = false;
  std::string name;  // "iteration 17 (LL, routing ..., T = 23, ...)": every failure message carries it
  HtCase ht_case{};
  Expected ht_expected;
  LlCase ll_case{};
  LlExpected ll_expected;
  int ll_payload = 0;  // index into kLlPayloads
};

LlCase stress_ll_case(int single_gpu_ranks, int T, int K, Routing routing, double p_empty, int payload, bool int32_idx,
                      const std::string& name) {
  return LlCase{.single_gpu_ranks = single_gpu_ranks,
                .T = T,
                .T_max = kTokensMax,
                .H = kHidden,
                .K = K,
                .E = kExperts,
                .routing = routing,
                .p_empty = p_empty,
                .payload = kLlPayloads[payload],
                .int32_idx = int32_idx,
                .dispatch_weights = true,  // so that combine runs in both orders
                .name = name};
}

// Iteration i: HT when i is even, LL when odd. The routing kind cycles with j = i / 2, so HT and LL
// each meet every kind; the payload and the id type change every cycle of kinds, HT's second bias
// every other pair of cycles. Every rank builds the same iteration from i alone.
Iteration build_iteration(int i, int R, int single_gpu_ranks) {
  const int j = i / 2;
  const Kind kind = Kind(j % kKinds);
  std::seed_seq seq{kSeed, uint32_t(i)};
  std::mt19937 rng(seq);
  const int T = kind == Kind::no_tokens ? 0 : std::uniform_int_distribution<int>(0, kTokensMax)(rng);
  // One expert: the one-hot routing with top-1 names expert 0 in every token's only slot.
  const int K = kind == Kind::one_expert ? 1 : kTopk;
  const Routing routing = kind == Kind::zipf         ? Routing::zipf
                          : kind == Kind::one_expert ? Routing::one_hot
                                                     : Routing::uniform;
  const double p_empty = kind == Kind::all_empty ? 1.0 : kind == Kind::one_expert ? 0.0 : 0.1;
  const bool int32_idx = (j / kKinds) % 2 == 1;
  const uint32_t seed = kSeed + uint32_t(i);

  Iteration it;
  it.is_ht = i % 2 == 0;
  it.name = "iteration " + std::to_string(i) + " (" + (it.is_ht ? "HT" : "LL") + ", routing " + kKindNames[j % kKinds] +
            ", T = " + std::to_string(T) + ", " + (int32_idx ? "int32" : "int64") + " ids, ";
  if (it.is_ht) {
    const bool fp8 = (j / (2 * kKinds)) % 2 == 1;
    const bool two_biases = (j / (4 * kKinds)) % 2 == 1;
    it.name += std::string(fp8 ? "fp8" : "bf16") + (two_biases ? ", two biases)" : ")");
    // team, T, H, K, E, routing, p_empty, fp8, int32 ids, column-major scales (no: row-major strides do not
    // depend on T), expert alignment, name
    it.ht_case = HtCase{single_gpu_ranks, T, kHidden, K, kExperts, routing, p_empty, fp8, int32_idx, false, 1, it.name};
    it.ht_case.two_biases = two_biases;
    it.ht_expected = build_expected(it.ht_case, R, seed);
  } else {
    it.ll_payload = (j / (2 * kKinds)) % kLlPayloadCount;
    it.name += std::string(kLlPayloadNames[it.ll_payload]) + ")";
    it.ll_case = stress_ll_case(single_gpu_ranks, T, K, routing, p_empty, it.ll_payload, int32_idx, it.name);
    it.ll_expected = build_ll_expected(it.ll_case, R, seed);
  }
  return it;
}

// Builds the iterations on worker threads ahead of the ranks that run them, each once for all
// `consumers` ranks that take it (the threads of a single-GPU team share one copy). The reference costs
// more than the GPU calls: built on the ranks' own threads it would set the test's pace. At most
// kBuildAhead + 1 iterations from the latest one taken are built at a time.
class IterationSource {
 public:
  IterationSource(int count, int consumers, std::function<Iteration(int)> build)
      : count_(count), consumers_(consumers), build_(std::move(build)) {}

  // Iteration i, once built (its exception, if the build threw). Every consumer takes 0, 1, 2, ... in
  // order; the last one to take an iteration drops it here.
  std::shared_ptr<const Iteration> take(int i) {
    std::shared_future<std::shared_ptr<const Iteration>> built;
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      for (; started_ < count_ && started_ <= i + kBuildAhead; ++started_) slots_[started_].built = start(started_);
      const auto slot = slots_.find(i);
      built = slot->second.built;
      if (++slot->second.taken == consumers_) slots_.erase(slot);
    }
    return built.get();
  }

 private:
  std::shared_future<std::shared_ptr<const Iteration>> start(int n) {
    return std::async(std::launch::async, [this, n] { return std::make_shared<const Iteration>(build_(n)); }).share();
  }

  // At most kBuildAhead + 1 = 7 builds run at once: with a single-GPU team's 8 rank threads, 15 busy
  // threads, within the 16 cores of the smallest device machine.
  static constexpr int kBuildAhead = 6;
  struct Slot {
    std::shared_future<std::shared_ptr<const Iteration>> built;
    int taken = 0;
  };
  const int count_, consumers_;
  const std::function<Iteration(int)> build_;
  std::mutex mutex_;
  int started_ = 0;
  // Declared last, so destroyed first: destroying a std::async future waits for its build, which
  // still uses build_ (a test that stops early leaves builds running).
  std::map<int, Slot> slots_;
};

// One rank's HT combine inputs, sized for every rank's T_max tokens; each iteration writes its rows at
// the front (the dispatch inputs are the fixture's RankInputs).
struct HtCombineArrays {
  DeviceArray y, y_weights, bias, second_bias;
  explicit HtCombineArrays(int R)
      : y(std::size_t(R) * kTokensMax * kHidden * 2),
        y_weights(std::size_t(R) * kTokensMax * kTopk * 4),
        bias(std::size_t(kTokensMax) * kHidden * 2),
        second_bias(std::size_t(kTokensMax) * kHidden * 2) {}
};

// One rank's buffers and arrays, made once: no iteration calls cudaMalloc or cudaFree (cudaFree waits
// for the whole GPU, where a single-GPU team's other ranks may be running kernels that wait for this
// rank's next call: docs/CONTRIBUTING.md, review checklist item 4).
struct Rig {
  HtBuffer ht;
  LlBuffer ll;
  RankInputs ht_in;  // sized for T_max; write_inputs rewrites them
  HtCombineArrays ht_combine_in;
  LlRankInputs ll_in;             // sized by a T_max iteration; write_ll_inputs rewrites them
  std::vector<LlOutputs> ll_out;  // one set per LL payload, sized for T_max

  explicit Rig(Team& team)
      : ht(team, HtBufferOptions{kTokensMax, kHidden, kTopk, kExperts}),
        ll(team, LlBufferOptions{kTokensMax, kHidden, kTopk, kExperts}),
        ht_in(allocate_inputs(kTokensMax, kHidden, kTopk)),
        ht_combine_in(team.size()) {
    const LlCase widest = stress_ll_case(0, kTokensMax, kTopk, Routing::uniform, 0.0, 0, false, "arrays");
    const LlExpected x = make_ll_inputs(widest, team.size(), kSeed);
    ll_in = upload_ll_inputs(widest, x, team.rank());
    for (int p = 0; p < kLlPayloadCount; ++p) {
      LlCase c = widest;
      c.payload = kLlPayloads[p];
      ll_out.push_back(allocate_ll_outputs(c, x, ll));
    }
  }
};

// Dispatch and combine with weights and one or two biases, checked as ht_test.cu checks its exact form.
// Each call is submitted together with the other ranks' (submit_together, single_gpu_ranks.hpp), after
// its copies.
void ht_exchange(const Iteration& it, Rig& rig, int rank, cudaStream_t stream) {
  const HtCase& c = it.ht_case;
  const Expected& x = it.ht_expected;
  const ref::HtRecv& want = x.dispatch.recv[rank];
  const int64_t N = want.num_recv_tokens;
  write_inputs(c, x.tokens[rank], rig.ht_in);
  const HtDispatchResult got = submit_together([&] { return rig.ht.dispatch(rig.ht_in.args, HtStreams{stream}); });
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ASSERT_EQ(got.num_recv_tokens, N) << "rank " << rank;
  EXPECT_EQ(got.num_recv_tokens_per_expert_host, want.num_recv_tokens_per_expert) << "rank " << rank;
  check_dispatch(c, rank, got, want, N);
  check_count_matrix(rank, got, x.dispatch.handle);

  const HtCombineArrays& a = rig.ht_combine_in;
  copy_to_device(a.y.data, x.y[rank].y.data);
  copy_to_device(a.y_weights.data, x.y[rank].topk_weights.data);
  copy_to_device(a.bias.data, x.bias[rank].data);
  HtCombineArgs args;
  args.y = TensorRef::matrix(a.y.data, ScalarType::bf16, N, c.H);
  args.topk_weights = TensorRef::matrix(a.y_weights.data, ScalarType::float32, N, c.K);
  args.bias = TensorRef::matrix(a.bias.data, ScalarType::bf16, c.T, c.H);
  if (c.two_biases) {
    copy_to_device(a.second_bias.data, x.second_bias[rank].data);
    args.second_bias = TensorRef::matrix(a.second_bias.data, ScalarType::bf16, c.T, c.H);
  }
  args.handle = got.handle;
  const HtCombineResult out = submit_together([&] { return rig.ht.combine(args, HtStreams{stream}); });
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  rig.ht.check_errors();
  check_combine(c, rank, out, x.combine[rank]);

  // Every row these calls returned is poisoned before the next ones (in stream order), so a row that a
  // later call fails to write cannot still hold an earlier right answer.
  for (const TensorRef& t : {got.recv_x, got.recv_x_scales, got.recv_src_idx, got.recv_topk_idx, got.recv_topk_weights,
                             out.x, out.topk_weights}) {
    poison(t, stream);
  }
}

// Dispatch, then combine in both orders, checked as ll_test.cu checks them (ll_exchange_and_check).
void ll_exchange(const Iteration& it, Rig& rig, Team& team, cudaStream_t stream) {
  const LlCase& c = it.ll_case;
  LlOutputs& out = rig.ll_out[std::size_t(it.ll_payload)];
  out.out.rows = c.T;  // combine's out: this iteration's tokens at the front of a T_max array
  write_ll_inputs(c, it.ll_expected, team.rank(), rig.ll_in);
  ll_exchange_and_check(c, it.ll_expected, rig.ll, team, rig.ll_in, out, stream);
  rig.ll.check_errors();
}

// Every iteration of `source` on one rank, until the first failure. A difference found by a check ends
// the test at the end of its iteration, once all of the iteration's calls are made, so that the team's
// other ranks can finish it too (only a call that fails, or a wrong received count, ends it sooner).
void run_rank(IterationSource& source, int iterations, Team& team, cudaStream_t stream) {
  const int rank = team.rank();
  Rig rig(team);
  const std::size_t ht_bytes = rig.ht.buffer_bytes(), ll_bytes = rig.ll.buffer_bytes();
  for (int i = 0; i < iterations; ++i) {
    const std::shared_ptr<const Iteration> it = source.take(i);
    SCOPED_TRACE(it->name);
    try {
      if (it->is_ht) {
        ht_exchange(*it, rig, rank, stream);
      } else {
        ll_exchange(*it, rig, team, stream);
      }
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << rank << ": " << e.what();
    }
    if (::testing::Test::HasFailure()) return;
  }
  // Thousands of calls leave the buffers as large as they were made (no handle block was added).
  EXPECT_EQ(rig.ht.buffer_bytes(), ht_bytes) << "rank " << rank << ": HtBuffer::buffer_bytes() grew";
  EXPECT_EQ(rig.ll.buffer_bytes(), ll_bytes) << "rank " << rank << ": LlBuffer::buffer_bytes() grew";
}

// One process per GPU (EP = the world size: 2 on a two-GPU machine).
TEST(Stress, WorldTeamTenThousandAlternatingExchanges) {
  EPX_REQUIRE_WORLD_SIZE(2);
  const int R = rank_info().world_size;
  if (kExperts % R != 0) GTEST_SKIP() << kExperts << " experts do not divide among " << R << " ranks";
  IterationSource source(kWorldIterations, 1, [R](int i) { return build_iteration(i, R, 0); });
  on_ranks(0, [&](Team& team, cudaStream_t stream) { run_rank(source, kWorldIterations, team, stream); });
}

// EP = 8 on one GPU: this process checks all 8 ranks' outputs, hence 500 iterations, not 10,000.
TEST(Stress, SingleGpu8FiveHundredAlternatingExchanges) {
  IterationSource source(kSingleGpuIterations, kSingleGpuRanks,
                         [](int i) { return build_iteration(i, kSingleGpuRanks, kSingleGpuRanks); });
  on_ranks(kSingleGpuRanks,
           [&](Team& team, cudaStream_t stream) { run_rank(source, kSingleGpuIterations, team, stream); });
}

}  // namespace
}  // namespace epx::test
