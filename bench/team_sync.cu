#include "bench/team_sync.hpp"

#include "core/cuda_check.hpp"
#include "transport/device/barrier.cuh"
#include "transport/team_impl.hpp"

namespace epx::bench {
namespace {

using detail::check_cuda;

constexpr int kThreads = 128;

__global__ void barrier_kernel(transport::TeamView team) { transport::team_barrier(team, kBenchBarrierSlot); }

// `table` holds [R][n] doubles, then this rank's own n values (staged by the host). Every thread copies
// its share of the own values into row `me` of every rank's table and fences at system scope; the
// barrier then publishes them (its releases follow a __syncthreads) and waits for every rank's rows.
__global__ void all_gather_kernel(transport::TeamView team, transport::SymmetricView table, int n) {
  const double* mine = reinterpret_cast<const double*>(table.base[team.rank]) + team.nranks * n;
  for (int r = 0; r < team.nranks; ++r) {
    double* row = reinterpret_cast<double*>(table.base[r]) + team.rank * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) row[i] = mine[i];
  }
  __threadfence_system();
  transport::team_barrier(team, kBenchBarrierSlot);
}

}  // namespace

void enqueue_team_barrier(Team& team, cudaStream_t stream) {
  barrier_kernel<<<1, kThreads, 0, stream>>>(team.impl().view());
  detail::check_launch("barrier_kernel");
}

std::vector<double> all_gather(Team& team, cudaStream_t stream, const std::vector<double>& mine) {
  const std::size_t R = team.size(), n = mine.size();
  std::vector<double> all(R * n);
  if (n == 0) return all;
  // Zeroed and registered by every rank before allocate_symmetric returns: peers may write at once.
  SymmetricMemory table = team.allocate_symmetric((R + 1) * n * sizeof(double));
  double* local = static_cast<double*>(table.local());
  check_cuda(cudaMemcpyAsync(local + R * n, mine.data(), n * sizeof(double), cudaMemcpyHostToDevice, stream),
             "cudaMemcpyAsync");
  all_gather_kernel<<<1, kThreads, 0, stream>>>(team.impl().view(), team.impl().symmetric_view(table), int(n));
  detail::check_launch("all_gather_kernel");
  check_cuda(cudaMemcpyAsync(all.data(), local, R * n * sizeof(double), cudaMemcpyDeviceToHost, stream),
             "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  team.check_device_errors();
  return all;
}

}  // namespace epx::bench
