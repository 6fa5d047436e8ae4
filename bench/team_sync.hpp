// Small collectives the bench runs between measurements, on a stream: a barrier of every rank (so that
// timed repetitions start together) and an all-gather of a few numbers (so that rank 0 can report the
// slowest rank). Both use the team's barrier slot kBenchBarrierSlot; the library's kernels never do.
#pragma once

#include <cuda_runtime_api.h>

#include <vector>

#include "epx/team.hpp"

namespace epx::bench {

inline constexpr int kBenchBarrierSlot = 1;

// Enqueues a barrier of every rank on `stream`: what follows on the stream starts once every rank's
// stream has reached its barrier. One CTA; call it on one stream at a time.
void enqueue_team_barrier(Team& team, cudaStream_t stream);

// Collective. Returns every rank's `mine`, rank after rank ([R][n], n = mine.size(), the same on every
// rank). Synchronises `stream` and reports an expired device wait as epx::Error.
std::vector<double> all_gather(Team& team, cudaStream_t stream, const std::vector<double>& mine);

}  // namespace epx::bench
