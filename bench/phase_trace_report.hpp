// --trace (a build with -DEPX_PHASE_TRACE=ON): one op called several times, each call's phase stamps
// (src/transport/device/phase_trace.hpp) read back, and per rank, with the median over the calls of each
// value, in us from the call's first stamp:
//   * trace: point=LAST[P50/P90] for each point reached, LAST the last warp to reach it (the first, for a
//     start) and P50 / P90 the median and 90th percentile over the warps that reached it;
//   * late warps: for each point but a start, the kLateWarps warps with the latest stamp of it, as
//     wINDEX:us, INDEX being the warp's index in the grid (CTA index x warps per CTA + warp in the CTA;
//     the LL kernels' CTAs have 16 warps), so that a tail past P90 says which work items it is;
//   * chain: every stamp, in order, of the kChainWarps warps whose last stamp is the latest, and the
//     median warp's (by its last stamp): where a warp's time went.
// A warp's stamps are its kernel start's %globaltimer plus the SM clock cycles since (at the device's
// clock rate): exact within a warp, within %globaltimer's step (32 ns on H200) across warps.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "bench/hold_stream.hpp"
#include "bench/timing.hpp"
#include "core/cuda_check.hpp"
#include "epx/team.hpp"
#include "transport/device/phase_trace.hpp"
#include "transport/team_impl.hpp"

namespace epx::bench {

// The start point of the kernel that stamps point p: the nearest start at or before it (each kernel
// family's points follow its start in TracePoint).
inline int trace_start_of(int p) {
  while (p > 0 && !transport::kTracePointInfo[p].keeps_earliest) --p;
  return p;
}

// One call's stamps in ns since the call's earliest %globaltimer stamp: [point][warp] (-1: not reached)
// and the team's words of warps past kTraceWarps. (%globaltimer counts ns since 1970, ~2^60: as a double
// it would keep only multiples of 256 ns, so stamps are made relative first.)
struct CallStamps {
  std::vector<std::vector<double>> warp_ns;
  std::vector<double> team_ns;  // -1: none
};

inline CallStamps call_stamps(const std::vector<uint64_t>& words, double cycles_per_ns) {
  constexpr int P = transport::kTracePoints, W = transport::kTraceWarps;
  CallStamps c{std::vector<std::vector<double>>(P, std::vector<double>(W, -1.0)), std::vector<double>(P, -1.0)};
  const auto reached = [](uint64_t ns) { return ns != 0 && ns != UINT64_MAX; };
  uint64_t base = UINT64_MAX;
  for (int p = 0; p < P; ++p) {
    if (reached(words[std::size_t(p)])) base = std::min(base, words[std::size_t(p)]);
    for (int w = 0; w < W; ++w) {
      const uint64_t ns = words[std::size_t(transport::trace_warp_word(w, p)) + 1];
      if (reached(ns)) base = std::min(base, ns);
    }
  }
  if (base == UINT64_MAX) return c;
  for (int p = 0; p < P; ++p) {
    const uint64_t team = words[std::size_t(p)];
    if (reached(team)) c.team_ns[std::size_t(p)] = double(team - base);
    const int start = trace_start_of(p);
    for (int w = 0; w < W; ++w) {
      const std::size_t at = std::size_t(transport::trace_warp_word(w, p));
      const std::size_t at_start = std::size_t(transport::trace_warp_word(w, start));
      if (!reached(words[at + 1])) continue;
      double ns = double(words[at + 1] - base);
      if (reached(words[at_start + 1])) {  // the start's %globaltimer plus the cycles since
        ns = double(words[at_start + 1] - base) + double(int64_t(words[at] - words[at_start])) / cycles_per_ns;
      }
      c.warp_ns[std::size_t(p)][std::size_t(w)] = ns;
    }
  }
  return c;
}

// `before` enqueues what precedes every call untimed (HT: the L2 flush and the team barrier; LL: the
// barrier), `call` the op; both on `stream`, which is synchronised after each call. Both are enqueued
// behind a hold of kTraceHoldNs (hold_stream), so that where `call` enqueues without waiting for the host
// (a graph launch), the ranks' kernels start as close together after the barrier as the timed calls'
// do: enqueued after the barrier had already ended, a rank's call started microseconds late.
inline void print_phase_trace(Team& team, cudaStream_t stream, const std::string& name, transport::TracePoint first,
                              const std::function<void()>& before, const std::function<void()>& call) {
  constexpr int kTraceCalls = 22, kLateWarps = 3, kChainWarps = 2;  // even: see LlBench::trace_calls
  constexpr uint64_t kTraceHoldNs = 100'000;
  constexpr int P = transport::kTracePoints, W = transport::kTraceWarps;
  int clock_khz = 0;
  detail::check_cuda(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, team.device()),
                     "cudaDeviceGetAttribute(clock rate)");
  const double cycles_per_ns = clock_khz / 1e6;
  std::vector<std::vector<double>> us(P), p50(P), p90(P);
  std::vector<std::vector<std::vector<double>>> by_warp(P, std::vector<std::vector<double>>(W));  // per call
  for (int i = 0; i < kTraceCalls; ++i) {
    team.impl().reset_trace(stream);
    hold_stream(stream, kTraceHoldNs);
    before();
    call();
    detail::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const CallStamps c = call_stamps(team.impl().read_trace(), cycles_per_ns);
    // The team's value of each point: over the warps' stamps and the team's word.
    std::vector<double> team_ns(P, -1.0);
    for (int p = 0; p < P; ++p) {
      const bool earliest = transport::kTracePointInfo[p].keeps_earliest;
      double v = c.team_ns[std::size_t(p)];
      for (const double ns : c.warp_ns[std::size_t(p)]) {
        if (ns >= 0 && (v < 0 || (earliest ? ns < v : ns > v))) v = ns;
      }
      team_ns[std::size_t(p)] = v;
    }
    const double origin = team_ns[std::size_t(first)];
    if (origin < 0) continue;  // no reference point: the call did not run
    const auto since_first = [&](double ns) { return (ns - origin) / 1000.0; };
    for (int p = 0; p < P; ++p) {
      if (team_ns[std::size_t(p)] < 0) continue;
      us[p].push_back(since_first(team_ns[std::size_t(p)]));
      std::vector<double> warps;
      for (int w = 0; w < W; ++w) {
        const double ns = c.warp_ns[std::size_t(p)][std::size_t(w)];
        if (ns < 0) continue;
        warps.push_back(since_first(ns));
        by_warp[p][std::size_t(w)].push_back(warps.back());
      }
      if (warps.empty()) warps.push_back(us[p].back());  // only warps past kTraceWarps reached it
      std::sort(warps.begin(), warps.end());
      p50[p].push_back(warps[warps.size() / 2]);
      p90[p].push_back(warps[warps.size() * 9 / 10]);
    }
  }
  const std::string who = " rank " + std::to_string(team.rank()) + " " + name + ":";
  std::string line = "trace" + who;
  for (int p = 0; p < P; ++p) {
    if (us[p].empty()) continue;
    char point[128];
    std::snprintf(point, sizeof point, " %s=%.2f[%.2f/%.2f]", transport::kTracePointInfo[p].name,
                  summarize(us[p]).median_us, summarize(p50[p]).median_us, summarize(p90[p]).median_us);
    line += point;
  }
  std::printf("%s\n", line.c_str());
  // Each warp's median stamp of each point it reached (-1: none), and of its last.
  std::vector<std::vector<double>> median(P, std::vector<double>(W, -1.0));
  std::vector<std::pair<double, int>> last;  // (median of its latest stamp, warp)
  for (int w = 0; w < W; ++w) {
    double latest = -1.0;
    for (int p = 0; p < P; ++p) {
      if (by_warp[p][std::size_t(w)].empty()) continue;
      median[p][std::size_t(w)] = summarize(by_warp[p][std::size_t(w)]).median_us;
      latest = std::max(latest, median[p][std::size_t(w)]);
    }
    if (latest >= 0) last.emplace_back(latest, w);
  }
  std::string late = "late warps" + who;
  for (int p = 0; p < P; ++p) {
    if (us[p].empty() || transport::kTracePointInfo[p].keeps_earliest) continue;
    std::vector<std::pair<double, int>> medians;  // (median stamp, warp)
    for (int w = 0; w < W; ++w) {
      if (median[p][std::size_t(w)] >= 0) medians.emplace_back(median[p][std::size_t(w)], w);
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
  // The chains: the latest warps', then the median warp's.
  std::sort(last.begin(), last.end(), std::greater<>());
  std::vector<int> chained;
  for (std::size_t i = 0; i < last.size() && int(i) < kChainWarps; ++i) chained.push_back(last[i].second);
  if (!last.empty()) chained.push_back(last[last.size() / 2].second);
  for (const int w : chained) {
    std::vector<std::pair<double, int>> stamps;  // (median, point)
    for (int p = 0; p < P; ++p) {
      if (median[p][std::size_t(w)] >= 0) stamps.emplace_back(median[p][std::size_t(w)], p);
    }
    std::sort(stamps.begin(), stamps.end());
    std::string chain = "chain" + who + " w" + std::to_string(w);
    for (const auto& [at, p] : stamps) {
      char point[96];
      std::snprintf(point, sizeof point, " %s=%.3f", transport::kTracePointInfo[p].name, at);
      chain += point;
    }
    std::printf("%s\n", chain.c_str());
  }
  std::fflush(stdout);
  team.check_device_errors();
}

}  // namespace epx::bench
