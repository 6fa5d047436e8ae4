// --trace (a build with -DEPX_PHASE_TRACE=ON): one op called eagerly several times, each call's phase
// stamps (src/transport/device/phase_trace.hpp) read back, and one line per rank printed with the median
// of each point reached, in us from the call's first stamp: point=LAST[P50/P90], LAST the team's stamp
// (the last warp to reach the point; the first, for a start) and P50 / P90 the median and 90th
// percentile over the warps that reached it (each warp's own last stamp of the point).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
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
  constexpr int P = transport::kTracePoints;
  std::vector<std::vector<double>> us(P), p50(P), p90(P);
  for (int i = 0; i < kTraceCalls; ++i) {
    team.impl().reset_trace(stream);
    before();
    call();
    detail::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const std::vector<uint64_t> stamps = team.impl().read_trace();
    if (stamps[int(first)] == UINT64_MAX) continue;  // no reference point: the call did not run
    const auto since_first = [&](uint64_t stamp) { return (double(stamp) - double(stamps[int(first)])) / 1000.0; };
    const auto reached = [](uint64_t stamp) { return stamp != 0 && stamp != UINT64_MAX; };
    for (int p = 0; p < P; ++p) {
      if (!reached(stamps[p])) continue;
      us[p].push_back(since_first(stamps[p]));
      std::vector<double> warps;
      for (int w = 0; w < transport::kTraceWarps; ++w) {
        const uint64_t stamp = stamps[std::size_t(transport::trace_warp_word(w, p))];
        if (reached(stamp)) warps.push_back(since_first(stamp));
      }
      if (warps.empty()) warps.push_back(us[p].back());  // only warps past kTraceWarps reached it
      std::sort(warps.begin(), warps.end());
      p50[p].push_back(warps[warps.size() / 2]);
      p90[p].push_back(warps[warps.size() * 9 / 10]);
    }
  }
  std::string line = "trace rank " + std::to_string(team.rank()) + " " + name + ":";
  for (int p = 0; p < P; ++p) {
    if (us[p].empty()) continue;
    char point[128];
    std::snprintf(point, sizeof point, " %s=%.2f[%.2f/%.2f]", transport::kTracePointInfo[p].name,
                  summarize(us[p]).median_us, summarize(p50[p]).median_us, summarize(p90[p]).median_us);
    line += point;
  }
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  team.check_device_errors();
}

}  // namespace epx::bench
