// --trace (a build with -DEPX_PHASE_TRACE=ON): one op called eagerly several times, each call's phase
// stamps (src/transport/device/phase_trace.hpp) read back, and one line per rank printed with the median
// of each point reached, in us from the call's first stamp: point=LAST[P50/P90], LAST the team's stamp
// (the last warp to reach the point; the first, for a start) and P50 / P90 the median and 90th
// percentile over the warps that reached it (each warp's own last stamp of the point). A second line per
// rank names, for each point but a start, the kLateWarps warps with the latest median stamp of it, as
// wINDEX:us, INDEX being the warp's index in the grid (CTA index x warps per CTA + warp in the CTA; the
// LL kernels' CTAs have 16 warps), so that a tail past P90 says which work items it is.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
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
  constexpr int kTraceCalls = 21, kLateWarps = 3;
  constexpr int P = transport::kTracePoints, W = transport::kTraceWarps;
  std::vector<std::vector<double>> us(P), p50(P), p90(P);
  std::vector<std::vector<std::vector<double>>> by_warp(P);  // [point][warp]: its stamps, one per call
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
      for (int w = 0; w < W; ++w) {
        const uint64_t stamp = stamps[std::size_t(transport::trace_warp_word(w, p))];
        if (!reached(stamp)) continue;
        warps.push_back(since_first(stamp));
        if (by_warp[p].empty()) by_warp[p].resize(W);
        by_warp[p][std::size_t(w)].push_back(warps.back());
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
  std::string late = "late warps rank " + std::to_string(team.rank()) + " " + name + ":";
  for (int p = 0; p < P; ++p) {
    if (by_warp[p].empty() || transport::kTracePointInfo[p].keeps_earliest) continue;
    std::vector<std::pair<double, int>> medians;  // (median stamp, warp)
    for (int w = 0; w < W; ++w) {
      if (!by_warp[p][std::size_t(w)].empty()) medians.emplace_back(summarize(by_warp[p][std::size_t(w)]).median_us, w);
    }
    const std::size_t n = std::min<std::size_t>(kLateWarps, medians.size());
    std::partial_sort(medians.begin(), medians.begin() + std::ptrdiff_t(n), medians.end(), std::greater<>());
    late += std::string(" ") + transport::kTracePointInfo[p].name + "=";
    for (std::size_t i = 0; i < n; ++i) {
      char warp[64];
      std::snprintf(warp, sizeof warp, "%sw%d:%.2f", i == 0 ? "" : ",", medians[i].second, medians[i].first);
      late += warp;
    }
  }
  std::printf("%s\n", late.c_str());
  std::fflush(stdout);
  team.check_device_errors();
}

}  // namespace epx::bench
