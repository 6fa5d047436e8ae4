// Rank masking of LL buffers (ll.hpp): a rank masked by the caller, a rank masked because a wait on it
// expired (mask_on_timeout), and two ranks that mask each other and then come back together. Every
// call is checked against the reference of the exchange the mask leaves: a masked rank's experts count
// as -1 and it sends no token.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "epx/ll.hpp"
#include "gpu_test_env.hpp"
#include "ll_fixture.hpp"
#include "single_gpu_ranks.hpp"

namespace epx::test {
namespace {

constexpr uint32_t kSeed = 6100;

// The buffer's rank mask, through `device` (int32 [R], allocated by the caller: see ll_exchange_and_check).
std::vector<int32_t> query_mask(LlBuffer& buffer, const DeviceArray& device, int R, cudaStream_t stream) {
  buffer.query_rank_mask(static_cast<int32_t*>(device.data), stream);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<int32_t> mask(std::size_t(R), -1);
  copy_from_device(mask, device.data);
  return mask;
}

std::vector<int32_t> mask_of(const std::vector<bool>& masked) {
  return std::vector<int32_t>(masked.begin(), masked.end());
}

// A rank that makes no call after the buffer exists: it keeps its buffer until the others are done
// (destroying it frees memory, and on a single GPU cudaFree waits for every rank's kernels).
class IdleRank {
 public:
  explicit IdleRank(int busy) : busy_(busy) {}
  // Held by each busy rank while it works (released on every way out, failed assertions included).
  struct Busy {
    IdleRank& idle;
    ~Busy() { idle.busy_.fetch_sub(1); }
  };
  // The idle rank makes no call: it leaves the busy ranks' meetings (submit_together), then waits.
  void wait_for_the_others() const {
    leave_rank_threads_meeting();
    while (busy_.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

 private:
  std::atomic<int> busy_;
};

// Ranks 0-2 of four mask rank 3, which makes no call: three rounds (both buffer sets) go on without
// it. Bad mask arguments are refused first. With the weights given to dispatch, and to combine (whose
// weights then go to every destination rank but the masked one).
void masked_rank_is_skipped(bool dispatch_weights) {
  LlCase c = ll_small_case(4);
  c.dispatch_weights = dispatch_weights;
  const std::vector<bool> masked = {false, false, false, true};
  IdleRank idle(3);
  on_single_gpu_team(4, TeamOptions{}, [&](Team& team, cudaStream_t stream) {
    const int rank = team.rank();
    const auto busy = rank == 3 ? nullptr : std::make_unique<IdleRank::Busy>(idle);
    const LlExpected want = ll_masked_expected(c, 4, kSeed, masked);
    LlBuffer buffer(team, ll_buffer_options(c, want));
    if (rank == 3) return idle.wait_for_the_others();
    const LlRankInputs in = upload_ll_inputs(c, want, rank);
    const LlOutputs out = allocate_ll_outputs(c, want, buffer);
    DeviceArray mask(sizeof(int32_t) * 4);
    EXPECT_THROW(buffer.set_rank_masked(rank, true, stream), Error);
    EXPECT_THROW(buffer.set_rank_masked(4, true, stream), Error);
    EXPECT_THROW(buffer.query_rank_mask(nullptr, stream), Error);
    EXPECT_EQ(query_mask(buffer, mask, 4, stream), std::vector<int32_t>(4, 0));
    buffer.set_rank_masked(3, true, stream);
    EXPECT_EQ(query_mask(buffer, mask, 4, stream), mask_of(masked));
    for (int round = 0; round < 3; ++round) {
      SCOPED_TRACE("round " + std::to_string(round));
      ll_exchange_and_check(c, want, buffer, team, in, out, stream);
    }
    buffer.check_errors();  // masking is not an error
    EXPECT_FALSE(team.failed());
  });
}

TEST(LlMask, MaskedRankIsSkipped) { masked_rank_is_skipped(true); }

TEST(LlMask, MaskedRankIsSkippedWeightsGivenToCombine) { masked_rank_is_skipped(false); }

// mask_on_timeout: rank 3 never calls; each other rank's first dispatch waits the team's timeout for
// it, masks it and goes on; the outputs are those of the masked exchange (the sends of that first
// call still went to rank 3, which nobody reads). The second round waits for nobody.
TEST(LlMask, ExpiredWaitMasksThePeer) {
  const LlCase c = ll_small_case(4);
  const std::vector<bool> masked = {false, false, false, true};
  IdleRank idle(3);
  on_single_gpu_team(4, TeamOptions{std::chrono::milliseconds(500)}, [&](Team& team, cudaStream_t stream) {
    const int rank = team.rank();
    const auto busy = rank == 3 ? nullptr : std::make_unique<IdleRank::Busy>(idle);
    const LlExpected want = ll_masked_expected(c, 4, kSeed + 1, masked);
    LlBufferOptions options = ll_buffer_options(c, want);
    options.mask_on_timeout = true;
    LlBuffer buffer(team, options);
    if (rank == 3) return idle.wait_for_the_others();
    const LlRankInputs in = upload_ll_inputs(c, want, rank);
    const LlOutputs out = allocate_ll_outputs(c, want, buffer);
    DeviceArray mask(sizeof(int32_t) * 4);
    for (int round = 0; round < 2; ++round) {
      SCOPED_TRACE("round " + std::to_string(round));
      ll_exchange_and_check(c, want, buffer, team, in, out, stream);
    }
    buffer.check_errors();  // masking is not an error
    EXPECT_EQ(query_mask(buffer, mask, 4, stream), mask_of(masked));
    EXPECT_FALSE(team.failed());
  });
}

// Two ranks mask each other (each then exchanges with itself alone) for two rounds, unmask each other
// at the same point of their call sequences, and exchange together again for two rounds: the sequence
// numbers of the calls they made apart are taken over. On the world team and on one GPU.
void mask_each_other_then_rejoin(Team& team, cudaStream_t stream) {
  const LlCase c = ll_small_case(team.is_single_gpu() ? team.size() : 0);
  ASSERT_EQ(team.size(), 2);
  const int rank = team.rank(), other = 1 - rank;
  std::vector<bool> masked(2, false);
  masked[std::size_t(other)] = true;
  const LlExpected apart = ll_masked_expected(c, 2, kSeed + 2, masked);
  const LlExpected together = build_ll_expected(c, 2, kSeed + 3);
  LlBuffer buffer(team, ll_buffer_options(c, together));
  const LlRankInputs in = upload_ll_inputs(c, apart, rank);
  const LlOutputs out = allocate_ll_outputs(c, apart, buffer);
  DeviceArray mask(sizeof(int32_t) * 2);
  buffer.set_rank_masked(other, true, stream);
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("apart, round " + std::to_string(round));
    ll_exchange_and_check(c, apart, buffer, team, in, out, stream);
  }
  buffer.clear_rank_mask(stream);
  EXPECT_EQ(query_mask(buffer, mask, 2, stream), std::vector<int32_t>(2, 0));
  write_ll_inputs(c, together, rank, in);
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("together, round " + std::to_string(round));
    ll_exchange_and_check(c, together, buffer, team, in, out, stream);
  }
  buffer.check_errors();
  EXPECT_FALSE(team.failed());
}

// Two tests, so that the sanitizer run can take the world team's alone (device_check.sh).
TEST(LlMask, WorldRanksMaskEachOtherThenRejoin) {
  if (rank_info().world_size != 2) {
    GTEST_SKIP() << "needs a world team of exactly 2 GPUs, this job has " << rank_info().world_size;
  }
  on_ranks(0, mask_each_other_then_rejoin);
}

TEST(LlMask, SingleGpuRanksMaskEachOtherThenRejoin) { on_ranks(2, mask_each_other_then_rejoin); }

}  // namespace
}  // namespace epx::test
