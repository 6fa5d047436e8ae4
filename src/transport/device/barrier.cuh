// Barrier of all ranks of a team, called by one whole CTA on each rank with the same slot.
//
// Protocol (ControlRegion): on barrier number n of `slot` (n = epoch[slot] + 1), thread p < R adds 1
// to rank p's arrivals[slot][me] with a system-scope release, after a __syncthreads that orders the
// CTA's earlier writes before it; then thread p waits, acquire, until the own arrivals[slot][p] >= n.
// A final __syncthreads makes every thread see what the peers wrote before arriving. Only this CTA
// touches epoch[slot], so two CTAs that barrier at once must use different slots.
#pragma once

#include "transport/device/flags.cuh"
#include "transport/device/wait.cuh"

namespace epx::transport {

// Returns false if a wait expired (the team is failed); every thread of the CTA gets the same answer.
__device__ inline bool team_barrier(const TeamView& team, int slot) {
  ControlRegion* mine = team.control_of(team.rank);
  __syncthreads();
  const uint64_t n = mine->epoch[slot] + 1;
  bool ok = true;
  for (int p = threadIdx.x; p < team.nranks; p += blockDim.x) {
    add_release_sys(&team.control_of(p)->arrivals[slot][team.rank], 1);
  }
  for (int p = threadIdx.x; p < team.nranks; p += blockDim.x) {
    ok = ok &&
         wait_at_least(team, &mine->arrivals[slot][p], n, WaitSite{WaitPhase::barrier, p, static_cast<uint32_t>(slot)});
  }
  ok = __syncthreads_and(ok);
  if (threadIdx.x == 0) mine->epoch[slot] = n;
  __syncthreads();
  return ok;
}

}  // namespace epx::transport
