// Phase trace, for profiling only (cmake -DEPX_PHASE_TRACE=ON; epx-bench --trace prints it). Kernels
// stamp %globaltimer at the numbered points below into their team's trace words (TeamView::trace): a
// point keeps the earliest stamp of the threads that reach it when it is a start, else the latest.
// The host resets the words before a call and reads them after it (Team::Impl::reset_trace and
// read_trace). Each stamp also goes to its warp's own row of words (the warp's index in the grid, below
// kTraceWarps), which keeps that warp's earliest or latest stamp of the point the same way, so that the
// report can say how the warps spread, not only which was last. Without the option there are no words
// and a stamp compiles to nothing. %globaltimer advances in steps of about 0.26 us on H200 (the committed
// traces): closer points do not separate.
#pragma once

#include <cstdint>

#include "transport/device/team_view.hpp"
#ifdef __CUDACC__
#include "transport/device/flags.cuh"
#endif

namespace epx::transport {

enum class TracePoint : int {
  ht_layout_start,           // HT layout: its first CTA has started
  ht_layout_ticket,          // every layout CTA has its tile (its ticket and call number are back)
  ht_layout_counted,         // every layout CTA has counted its tile (ids loaded, expert and rank counts)
  ht_layout_published,       // every layout CTA has published its tile's totals
  ht_layout_bases,           // every layout CTA has the earlier tiles' counts
  ht_layout_end,             // thread 0 of every layout CTA is done
  ht_dispatch_start,         // HT dispatch: its first CTA has started
  ht_dispatch_layout_done,   // every dispatch CTA is past its wait for the layout grid
  ht_dispatch_counts_cta0,   // CTA 0 has every rank's counts
  ht_dispatch_reported,      // CTA 0 has reported N to the host
  ht_dispatch_counts,        // every CTA knows whether and where to send
  ht_dispatch_first_stores,  // every warp has issued its first row's stores
  ht_dispatch_last_stores,   // every warp has issued its last row's stores
  ht_dispatch_stores_done,   // every warp's stores are done
  ht_dispatch_signalled,     // every CTA has signalled the peers and counted itself (the last CTA's stamp)
  ht_dispatch_end,           // every peer's rows are here
  ll_dispatch_start,   // LL dispatch (a launch with the sends, the receive step or both): its first CTA has started
  ll_dispatch_loaded,  // every warp whose first work is a send item has loaded it (FP8: and cast it)
  ll_dispatch_staged,  // every CTA has staged the top-k table
  ll_dispatch_counts_sent,  // the last CTA has written the counts and manifests
  ll_dispatch_free,         // every warp that stores remotely has seen the set freed by every peer (its first check)
  ll_dispatch_routing,      // every routing item has written its headers and home record
  ll_dispatch_sent,         // every warp with a send item has issued its stores
  ll_dispatch_manifest,     // every receive item's wait for its manifest word (and header, if its message came) is over
  ll_dispatch_header,       // every receive item of a message that came has its header (the same wait)
  ll_dispatch_routed,       // every receive item has its message's routing (manifest, header, counts)
  ll_dispatch_received,     // every receive item has stored its payload
  ll_dispatch_outputs,      // the last CTA has written the per-expert outputs
  ll_dispatch_end,          // every CTA is done (the last one after recording the call as freed)
  ll_combine_start,         // LL combine (a launch with the sends, the receive step or both): its first CTA has started
  ll_combine_free,          // every warp with a message to send has seen the set freed by every peer (its first check)
  ll_combine_sent,          // every warp with a send item has issued its stores
  ll_combine_received,      // every warp has written its output columns (its rows' lines all came)
  ll_combine_end,           // every CTA is done (the last one after recording the call as freed)
  count
};
inline constexpr int kTracePoints = int(TracePoint::count);
// The trace words: kTracePoints for the team, then a row of kTracePoints per warp of the grid (warps
// past kTraceWarps stamp only the team's: with more than 256 CTAs of 16 warps the report's percentiles
// cover the first 4096 warps).
inline constexpr int kTraceWarps = 4096;
inline constexpr int kTraceWords = kTracePoints * (1 + kTraceWarps);
// Warp w's word of point p (w < kTraceWarps); the team's is word p.
inline constexpr int trace_warp_word(int w, int p) { return kTracePoints * (1 + w) + p; }
// Each point's name (what epx-bench --trace prints) and whether it keeps the earliest stamp (a kernel's
// start) rather than the latest.
struct TracePointInfo {
  const char* name;
  bool keeps_earliest;
};
inline constexpr TracePointInfo kTracePointInfo[] = {
    {"layout_start", true},
    {"layout_ticket", false},
    {"layout_counted", false},
    {"layout_published", false},
    {"layout_bases", false},
    {"layout_end", false},
    {"dispatch_start", true},
    {"dispatch_layout_done", false},
    {"dispatch_counts_cta0", false},
    {"dispatch_reported", false},
    {"dispatch_counts", false},
    {"dispatch_first_stores", false},
    {"dispatch_last_stores", false},
    {"dispatch_stores_done", false},
    {"dispatch_signalled", false},
    {"dispatch_end", false},
    {"ll_start", true},
    {"ll_loaded", false},
    {"ll_staged", false},
    {"ll_counts_sent", false},
    {"ll_free", false},
    {"ll_routing", false},
    {"ll_sent", false},
    {"ll_manifest", false},
    {"ll_header", false},
    {"ll_routed", false},
    {"ll_received", false},
    {"ll_outputs", false},
    {"ll_end", false},
    {"llc_start", true},
    {"llc_free", false},
    {"llc_sent", false},
    {"llc_received", false},
    {"llc_end", false},
};
static_assert(sizeof(kTracePointInfo) / sizeof(kTracePointInfo[0]) == kTracePoints, "an entry for every point");
inline constexpr bool trace_keeps_earliest(TracePoint p) { return kTracePointInfo[int(p)].keeps_earliest; }

#ifdef __CUDACC__
// Called by one thread per stamp (a CTA's thread 0, or a warp's lane 0). The point is a template
// argument so that which stamp it keeps is decided at compile time: device code cannot read the host
// table kTracePointInfo at run time.
template <TracePoint kPoint>
__device__ __forceinline__ void trace(const TeamView& team) {
#ifdef EPX_PHASE_TRACE
  const uint64_t now = global_timer_ns();
  const uint32_t warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  auto* team_word = reinterpret_cast<unsigned long long*>(team.trace) + int(kPoint);
  auto* warp_word = reinterpret_cast<unsigned long long*>(team.trace) + trace_warp_word(int(warp), int(kPoint));
  if constexpr (trace_keeps_earliest(kPoint)) {
    atomicMin(team_word, now);
    if (warp < kTraceWarps) atomicMin(warp_word, now);
  } else {
    atomicMax(team_word, now);
    if (warp < kTraceWarps) atomicMax(warp_word, now);
  }
#else
  (void)team;
#endif
}
#endif

}  // namespace epx::transport
