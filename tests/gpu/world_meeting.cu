// The world team's ranks meeting on the host before a call (submit_together, single_gpu_ranks.hpp).
//
// A team barrier (transport::team_barrier, one CTA, its own slot of the team's control region) in a
// kernel of its own, whose waits are bounded by kMeetingTimeout instead of the team's wait timeout: the
// host work between two calls differs between ranks by seconds where their outputs differ in size (a
// skewed routing at T = 1024 gives one rank most of the rows to check), and a meeting must outlast that
// without failing the team. The host waits for the kernel, so every rank returns once all have arrived.
// A wait that expires all the same fails the team as any other does (check_device_errors throws).
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>

#include "core/cuda_check.hpp"
#include "single_gpu_ranks.hpp"
#include "transport/device/barrier.cuh"
#include "transport/team_impl.hpp"

namespace epx::test {
namespace {

constexpr int kMeetingSlot = 1;  // transport_round_trip_test.cu's barriers use slot 0
constexpr std::chrono::nanoseconds kMeetingTimeout = std::chrono::minutes(2);

__global__ void meeting_kernel(transport::TeamView team) { transport::team_barrier(team, kMeetingSlot); }

cudaStream_t meeting_stream = nullptr;

}  // namespace

void prepare_world_meeting() {
  if (meeting_stream != nullptr) return;
  detail::load_kernel(reinterpret_cast<const void*>(meeting_kernel), "meeting_kernel");
  detail::check_cuda(cudaStreamCreateWithFlags(&meeting_stream, cudaStreamNonBlocking), "cudaStreamCreate");
}

void meet_world_ranks(Team& team) {
  transport::TeamView view = team.impl().view();
  view.timeout_ns = uint64_t(kMeetingTimeout.count());
  meeting_kernel<<<1, 32, 0, meeting_stream>>>(view);
  detail::check_launch("meeting_kernel");
  detail::check_cuda(cudaStreamSynchronize(meeting_stream), "cudaStreamSynchronize");
  team.check_device_errors();
}

}  // namespace epx::test
