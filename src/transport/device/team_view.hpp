// What a kernel sees of a team: plain, trivially copyable structs passed by value as kernel
// parameters. No NCCL or C++ host types, so the same kernels run on NCCL windows, on the single-GPU
// multi-rank mode and, later, on other transports. Host code fills them (src/transport/team.cpp).
#pragma once

#include <cuda_runtime_api.h>  // __host__ __device__ for host compilers

#include <cstdint>
#include <type_traits>

#include "epx/team.hpp"

namespace epx::transport {

// One symmetric allocation as seen from this rank's GPU: base[r] is rank r's copy.
struct SymmetricView {
  char* base[kMaxNvlinkRanks];
};

// What a device wait was doing when it expired. Kernel families add their own phases here, so that
// the host error names them.
enum class WaitPhase : uint32_t {
  none = 0,
  barrier,           // team barrier: waiting for a peer's arrival
  test_signal,       // transport test: waiting for a peer's put-with-signal
  ht_layout,         // HT layout: waiting for an earlier tile's token counts (detail: the tile)
  ht_notify,         // HT dispatch: waiting for a source's counts (a stamped word, see below)
  ht_dispatch_done,  // HT dispatch: waiting for a source's rows (detail: the source's CTA; a stamped word)
  ht_combine_ready,  // HT combine: waiting for an expert side's combine input to hold a row (detail: the row;
                     // a stamped word)
  ht_combine_done,   // HT combine: waiting for a home rank to finish reading my input (detail: its CTA; a
                     // stamped word)
  ht_bulk_load,      // HT dispatch and combine: waiting for the copy engine to load a row (detail: token)
  ll_dispatch_recv,  // LL dispatch: waiting for a source's stamped word or payload line (detail: the token,
                     // or the expert for counts; expected and observed: the words, core::LlWord, or for a
                     // line its stamp in the high half)
  ll_combine_recv,   // LL combine: waiting for an expert side's row lines (detail: the token; expected and
                     // observed: the line's stamp in the high half)
  ll_set_reuse,      // LL: waiting for a peer to finish reading a buffer set before writing it again
  // LL combine: the expert side waiting for a home rank's weights (detail: the token; expected and
  // observed: the words, core::LlWord)
  ll_combine_weights,
};

// The record of the first wait of a team that expired. Lives in host-mapped memory, so the host can
// read it after the kernel has returned. Protocol: a timed-out thread claims it with an atomic
// compare-and-swap of `claimed` 0 -> 1 (device scope is enough: one GPU writes it), fills the other
// fields, then sets `complete` to 1 after a system-scope fence; the host reads the fields only when
// `complete` is 1. Later timeouts (other threads giving up because the first one did) do not
// overwrite it. Every thread whose wait expires sets ControlRegion::failed (the claiming one after the
// report's fields), which every wait polls now and then
// (giving up once it is set, so one dead peer stops a whole kernel within about one timeout, not one
// timeout per waiting thread) and every kernel reads before it signals peers: device memory, unlike
// this report, which a GPU reads over PCIe in microseconds.
struct WaitReport {
  uint32_t claimed;
  uint32_t complete;
  int32_t rank;     // the rank that waited
  int32_t peer;     // the rank it waited for (-1: not a single peer)
  uint32_t phase;   // a WaitPhase
  uint32_t detail;  // phase-specific: a slot, a channel, an iteration
  // The value it waited for: a counter at least `expected`; in the phases that wait for a stamped word
  // (core::stamped: a call's stamp in the high half, a value in the low half; wait_report.cpp's
  // waits_for_stamp), the same stamp and at least that value; in the LL receive phases (ll_dispatch_recv,
  // ll_combine_recv), a word or line that carries exactly that stamp (the low half is not compared).
  uint64_t expected;
  uint64_t observed;  // the last value it saw
  uint64_t waited_ns;
};
static_assert(sizeof(WaitReport) == 48, "WaitReport is shared with the host: keep its layout pinned");

// The team's own control region (one symmetric allocation): barrier arrival counters, and whether the
// team has failed.
inline constexpr int kBarrierSlots = 32;  // barriers that may run at once (one per CTA that calls one)
struct ControlRegion {
  // arrivals[slot][p]: how many times rank p arrived at barrier `slot` of the owning rank.
  // Written by rank p with a system-scope release add; read by the owner with acquire loads.
  uint64_t arrivals[kBarrierSlots][kMaxNvlinkRanks];
  // epoch[slot]: how many barriers on `slot` the owner has completed. Owner only.
  uint64_t epoch[kBarrierSlots];
  // 1 once a wait of the owner's kernels expired (set by every thread whose wait expired). Owner only.
  uint32_t failed;
};

struct TeamView {
  int32_t rank;
  int32_t nranks;
  uint64_t timeout_ns;
  WaitReport* report;     // device address of this rank's host-mapped report
  SymmetricView control;  // each rank's ControlRegion
  uint64_t* trace;        // this rank's phase-trace words (EPX_PHASE_TRACE builds; else null)

  __host__ __device__ ControlRegion* control_of(int r) const {
    return reinterpret_cast<ControlRegion*>(control.base[r]);
  }
};
static_assert(std::is_trivially_copyable_v<TeamView>, "TeamView is a kernel parameter");

}  // namespace epx::transport
