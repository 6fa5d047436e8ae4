// One op's timing over the whole team, reduced to what the bench reports: the slowest rank's median,
// and that rank's bytes and GB/s.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "bench/team_sync.hpp"
#include "bench/timing.hpp"
#include "epx/team.hpp"

namespace epx::bench {

// What one rank measured for one op; bytes are per direction.
struct RankTiming {
  Timing timing;
  double nvlink_bytes = 0, algo_bytes = 0;
};

struct TeamTiming {
  double time_us = 0;             // the slowest rank's median
  double min_us = 0, max_us = 0;  // over every rank's repetitions
  int slowest_rank = 0;
  std::vector<double> median_us_per_rank;
  double nvlink_bytes = 0, algo_bytes = 0;  // the slowest rank's, per direction
  double nvlink_gbps = 0, algo_gbps = 0;
};

// Collective: every rank passes its ops in the same order; every rank gets the same result, per op.
inline std::vector<TeamTiming> gather_timings(Team& team, cudaStream_t stream, const std::vector<RankTiming>& ops) {
  constexpr int kValues = 5;  // what each rank contributes per op
  std::vector<double> mine;
  for (const RankTiming& m : ops) {
    mine.insert(mine.end(), {m.timing.median_us, m.timing.min_us, m.timing.max_us, m.nvlink_bytes, m.algo_bytes});
  }
  const std::vector<double> all = all_gather(team, stream, mine);
  std::vector<TeamTiming> out;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    auto at = [&](int r, int field) { return all[r * mine.size() + i * kValues + field]; };
    TeamTiming t;
    t.min_us = at(0, 1);
    t.max_us = at(0, 2);
    for (int r = 0; r < team.size(); ++r) {
      t.median_us_per_rank.push_back(at(r, 0));
      if (at(r, 0) > at(t.slowest_rank, 0)) t.slowest_rank = r;
      t.min_us = std::min(t.min_us, at(r, 1));
      t.max_us = std::max(t.max_us, at(r, 2));
    }
    t.time_us = at(t.slowest_rank, 0);
    t.nvlink_bytes = at(t.slowest_rank, 3);
    t.algo_bytes = at(t.slowest_rank, 4);
    t.nvlink_gbps = t.nvlink_bytes / t.time_us / 1e3;
    t.algo_gbps = t.algo_bytes / t.time_us / 1e3;
    out.push_back(t);
  }
  return out;
}

}  // namespace epx::bench
