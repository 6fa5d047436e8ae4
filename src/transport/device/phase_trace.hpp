// Phase trace, for profiling only (cmake -DEPX_PHASE_TRACE=ON; epx-bench --trace prints it). Kernels
// stamp the numbered points below into their team's trace words (TeamView::trace), one thread per stamp
// (a warp's lane 0, or a CTA's thread 0). Each stamp goes to its warp's own row (the warp's index in the
// grid, below kTraceWarps) as two plain stores, no atomics: the SM's clock64 and %globaltimer. Every
// warp stamps the start point of its kernel, so the report places each of its later stamps at the
// start's %globaltimer plus the clock cycles since the start: exact within a warp, and within
// %globaltimer's step (32 ns on H200) across warps. A point keeps the warp's latest stamp (a start: its
// only one). Warps past kTraceWarps stamp the team's words instead (%globaltimer, by atomics): the
// earliest stamp of a start, the latest of any other point. The host resets the words before a call and
// reads them after it (Team::Impl::reset_trace and read_trace). Without the option there are no words
// and a stamp compiles to nothing. (Traces committed before session 22 of 2026-11-23 show steps of
// 0.256 us: the report then converted ns since 1970, ~2^60, to double, which keeps 53 bits.)
#pragma once

#include <cstdint>

#include "transport/device/team_view.hpp"

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
  ht_copy_start,             // HT combine's copy of y: its first CTA has started
  ht_copy_first_group,       // every copy CTA has signalled its first group of rows
  ht_copy_end,               // every copy CTA has signalled its last group
  ht_combine_start,          // HT combine: its first CTA has started
  ht_combine_first_ready,    // every warp's first wait for another rank's rows is over (a wait while the warp knew
                             // of none of them; with the copy, a warp may wait so twice when copy CTA 0 lags)
  ht_combine_first_added,    // every warp has added its first piece
  ht_combine_last_added,     // every warp has written its last chunk
  ht_combine_signalled,      // every CTA has signalled every rank that it is done reading
  ht_combine_end,            // every CTA is done (the last one after every rank's signals)
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
  ll_dispatch_lines,        // every receive item has its part's payload lines (before it copies them)
  ll_dispatch_received,     // every receive item has stored its payload
  ll_dispatch_outputs,      // the last CTA has written the per-expert outputs
  ll_dispatch_end,          // every CTA is done (the last one after recording the call as freed)
  ll_combine_start,         // LL combine (a launch with the sends, the receive step or both): its first CTA has started
  ll_combine_own,           // every warp that reduces its first receive item's own rows early has them (early_own_rows)
  ll_combine_free,          // every warp with a message to send has seen the set freed by every peer (its first check)
  ll_combine_reduced,       // every send item has its y rows loaded and reduced (local order), before its stores
  ll_combine_sent,          // every warp with a send item has issued its stores
  ll_combine_lines,         // every receive item has its rows' lines and their sums (before it writes them)
  ll_combine_received,      // every warp has written its output columns (its rows' lines all came)
  ll_combine_end,           // every CTA is done (the last one after recording the call as freed)
  count
};
inline constexpr int kTracePoints = int(TracePoint::count);
// The trace words: kTracePoints for the team (warps past kTraceWarps), then a row per warp of the grid
// with two words per point, its clock64 and its %globaltimer (0: not reached).
inline constexpr int kTraceWarps = 4096;
inline constexpr int kTraceWords = kTracePoints * (1 + 2 * kTraceWarps);
// Warp w's clock64 word of point p (w < kTraceWarps), its %globaltimer word the next; the team's is word p.
inline constexpr int trace_warp_word(int w, int p) { return kTracePoints + 2 * (kTracePoints * w + p); }
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
    {"copy_start", true},
    {"copy_first_group", false},
    {"copy_end", false},
    {"combine_start", true},
    {"combine_first_ready", false},
    {"combine_first_added", false},
    {"combine_last_added", false},
    {"combine_signalled", false},
    {"combine_end", false},
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
    {"ll_lines", false},
    {"ll_received", false},
    {"ll_outputs", false},
    {"ll_end", false},
    {"llc_start", true},
    {"llc_own", false},
    {"llc_free", false},
    {"llc_reduced", false},
    {"llc_sent", false},
    {"llc_lines", false},
    {"llc_received", false},
    {"llc_end", false},
};
static_assert(sizeof(kTracePointInfo) / sizeof(kTracePointInfo[0]) == kTracePoints, "an entry for every point");
inline constexpr bool trace_keeps_earliest(TracePoint p) { return kTracePointInfo[int(p)].keeps_earliest; }

#ifdef __CUDACC__
// Called by one thread per stamp (a warp's lane 0, or a CTA's thread 0). The point is a template
// argument so that which stamp it keeps is decided at compile time: device code cannot read the host
// table kTracePointInfo at run time.
template <TracePoint kPoint>
__device__ __forceinline__ void trace(const TeamView& team) {
#ifdef EPX_PHASE_TRACE
  // Both reads after every earlier memory access of this thread in program order (clock64() alone
  // may be scheduled before the instruction that a point means to follow).
  uint64_t clock, now;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(clock) : : "memory");
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now) : : "memory");
  const uint32_t warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  auto* words = reinterpret_cast<unsigned long long*>(team.trace);
  if (warp < kTraceWarps) {  // the warp's own row: this thread is its only writer
    words[trace_warp_word(int(warp), int(kPoint))] = clock;
    words[trace_warp_word(int(warp), int(kPoint)) + 1] = now;
  } else if constexpr (trace_keeps_earliest(kPoint)) {
    atomicMin(words + int(kPoint), now);
  } else {
    atomicMax(words + int(kPoint), now);
  }
#else
  (void)team;
#endif
}
#endif

}  // namespace epx::transport
