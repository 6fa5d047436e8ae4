// Transport round trip: every rank puts a self-describing payload into every rank's receive slot,
// signals it, waits for everyone's signal, checks every received word, and meets the others at a
// team barrier before the next iteration may overwrite the slots. 1000 iterations; on 2 GPUs (one
// process each, NCCL windows) and on one GPU with 2, 4 and 8 ranks.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "core/cuda_check.hpp"
#include "expect_error.hpp"
#include "gpu_test_env.hpp"
#include "single_gpu_ranks.hpp"
#include "transport/device/barrier.cuh"
#include "transport/device/nvlink_put.cuh"
#include "transport/device/wait.cuh"
#include "transport/team_impl.hpp"

namespace epx::test {
namespace {

using transport::NvlinkPut;
using transport::SymmetricView;
using transport::TeamView;

constexpr int kWords = 4096;  // uint64 words per (source, destination) slot: 32 KiB
constexpr int kIterations = 1000;

// Symmetric layout per rank: slots[source][kWords], then signals[source].
struct Exchange {
  uint64_t slots[kMaxNvlinkRanks][kWords];
  uint64_t signals[kMaxNvlinkRanks];
};

// The payload names its source, destination, iteration and position, so a misplaced word says where
// it came from.
__host__ __device__ uint64_t payload(int source, int destination, int iteration, int word) {
  return (uint64_t(source) << 56) | (uint64_t(destination) << 48) | (uint64_t(iteration) << 24) | uint64_t(word);
}

struct Mismatch {
  unsigned long long count;
  int source, word;
  uint64_t got, want;
};

// Block p sends to rank p, then receives from rank p and checks. One block per peer.
__global__ void put_wait_check(TeamView team, SymmetricView exchange, uint64_t* staging, int iteration,
                               Mismatch* mismatch) {
  const int p = blockIdx.x;
  uint64_t* out = staging + size_t(p) * kWords;
  for (int w = threadIdx.x; w < kWords; w += blockDim.x) out[w] = payload(team.rank, p, iteration, w);
  __syncthreads();
  auto* remote = reinterpret_cast<Exchange*>(exchange.base[p]);
  NvlinkPut::put_signal_block(remote->slots[team.rank], out, sizeof(uint64_t) * kWords, &remote->signals[team.rank], 1);

  auto* mine = reinterpret_cast<Exchange*>(exchange.base[team.rank]);
  __shared__ bool arrived;
  if (threadIdx.x == 0) {
    arrived = transport::wait_at_least(team, &mine->signals[p], uint64_t(iteration),
                                       transport::WaitSite{transport::WaitPhase::test_signal, p, uint32_t(iteration)});
  }
  __syncthreads();
  if (!arrived) return;
  for (int w = threadIdx.x; w < kWords; w += blockDim.x) {
    const uint64_t got = mine->slots[p][w];
    const uint64_t want = payload(p, team.rank, iteration, w);
    if (got != want && atomicAdd(&mismatch->count, 1ull) == 0ull) {
      mismatch->source = p;
      mismatch->word = w;
      mismatch->got = got;
      mismatch->want = want;
    }
  }
}

__global__ void barrier_kernel(TeamView team) { transport::team_barrier(team, 0); }

// Runs the whole round trip for one rank on `stream`, checking as it goes.
void run_round_trip(Team& team, cudaStream_t stream) {
  using detail::check_cuda;
  SymmetricMemory exchange = team.allocate_symmetric(sizeof(Exchange));
  const TeamView view = team.impl().view();
  const SymmetricView exchange_view = team.impl().symmetric_view(exchange);
  uint64_t* staging = nullptr;
  Mismatch* mismatch = nullptr;
  check_cuda(cudaMalloc(&staging, sizeof(uint64_t) * kWords * team.size()), "cudaMalloc");
  check_cuda(cudaMalloc(&mismatch, sizeof(Mismatch)), "cudaMalloc");
  check_cuda(cudaMemsetAsync(mismatch, 0, sizeof(Mismatch), stream), "cudaMemsetAsync");
  for (int it = 1; it <= kIterations; ++it) {
    put_wait_check<<<team.size(), 256, 0, stream>>>(view, exchange_view, staging, it, mismatch);
    detail::check_launch("put_wait_check");
    barrier_kernel<<<1, 64, 0, stream>>>(view);
    detail::check_launch("barrier_kernel");
    if (it % 8 == 0) check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");  // few launches in flight
  }
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  team.check_device_errors();
  Mismatch found{};
  check_cuda(cudaMemcpy(&found, mismatch, sizeof(Mismatch), cudaMemcpyDeviceToHost), "cudaMemcpy");
  EXPECT_EQ(found.count, 0ull) << "rank " << team.rank() << ": first bad word from rank " << found.source << " at "
                               << found.word << ": got " << std::hex << found.got << ", want " << found.want;

  // The host checks the last iteration's slots too, word by word.
  std::vector<Exchange> last(1);
  check_cuda(cudaMemcpy(last.data(), exchange.local(), sizeof(Exchange), cudaMemcpyDeviceToHost), "cudaMemcpy");
  int bad = 0;
  for (int p = 0; p < team.size(); ++p) {
    EXPECT_EQ(last[0].signals[p], uint64_t(kIterations)) << "signal from rank " << p;
    for (int w = 0; w < kWords; ++w) bad += last[0].slots[p][w] != payload(p, team.rank(), kIterations, w);
  }
  EXPECT_EQ(bad, 0) << "rank " << team.rank() << ": bad words in the last iteration";
  cudaFree(staging);
  cudaFree(mismatch);
}

TEST(TransportRoundTrip, OneProcessPerGpu) {
  EPX_REQUIRE_WORLD_SIZE(2);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  run_round_trip(world_team(), stream);
  cudaStreamDestroy(stream);
}

class SingleGpuRoundTrip : public ::testing::TestWithParam<int> {};

TEST_P(SingleGpuRoundTrip, AllRanks) {
  on_single_gpu_team(GetParam(), TeamOptions{}, [](Team& team, cudaStream_t stream) { run_round_trip(team, stream); });
}

INSTANTIATE_TEST_SUITE_P(Ranks, SingleGpuRoundTrip, ::testing::Values(2, 4, 8));

// A rank that waits at a barrier its peer never reaches must give up within the timeout and name
// whom it waited for; the team is failed afterwards and can still be destroyed.
TEST(TransportTimeout, BarrierWithAbsentPeerReportsIt) {
  auto teams = Team::create_single_gpu(2, TeamOptions{std::chrono::milliseconds(200)});
  Team& team = *teams[0];
  barrier_kernel<<<1, 64>>>(team.impl().view());  // rank 1 never arrives
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  expect_error(ErrorKind::timeout, {"epx rank 0", "team barrier", "waiting for rank 1"},
               [&] { team.check_device_errors(); });
  EXPECT_TRUE(team.failed());
  EXPECT_THROW(team.allocate_symmetric(4096), Error);
}

}  // namespace
}  // namespace epx::test
