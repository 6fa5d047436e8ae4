// --trace (a build with -DEPX_PHASE_TRACE=ON): one op called eagerly several times, each call's phase
// stamps (src/transport/device/phase_trace.hpp) read back, and one line per rank printed with the median
// of each point reached, in us from the call's first stamp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench/timing.hpp"
#include "core/cuda_check.hpp"
#include "epx/team.hpp"
#include "transport/device/phase_trace.hpp"
#include "transport/team_impl.hpp"

namespace epx::bench {

// `before` enqueues what precedes every call untimed (HT: the L2 flush and the team barrier; LL: the
// barrier), `call` the op; both on `stream`, which is synchronised after each call.
inline void print_phase_trace(Team& team, cudaStream_t stream, const std::string& name, transport::TracePoint first,
                              const std::function<void()>& before, const std::function<void()>& call) {
  constexpr int kTraceCalls = 21;
  std::vector<std::vector<double>> us(transport::kTracePoints);
  for (int i = 0; i < kTraceCalls; ++i) {
    team.impl().reset_trace(stream);
    before();
    call();
    detail::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const std::vector<uint64_t> stamps = team.impl().read_trace();
    if (stamps[int(first)] == UINT64_MAX) continue;  // no reference point: the call did not run
    for (int p = 0; p < transport::kTracePoints; ++p) {
      const bool reached = stamps[p] != 0 && stamps[p] != UINT64_MAX;
      if (reached) us[p].push_back((double(stamps[p]) - double(stamps[int(first)])) / 1000.0);
    }
  }
  std::string line = "trace rank " + std::to_string(team.rank()) + " " + name + ":";
  for (int p = 0; p < transport::kTracePoints; ++p) {
    if (us[p].empty()) continue;
    char point[96];
    std::snprintf(point, sizeof point, " %s=%.2f", transport::kTracePointInfo[p].name, summarize(us[p]).median_us);
    line += point;
  }
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  team.check_device_errors();
}

}  // namespace epx::bench
