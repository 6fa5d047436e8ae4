// The bounded wait of the library: every device-side spin on a flag or word goes through spin_until
// (wait_until for one flag; wait_at_least, its usual form, waits for a counter); mbarrier_wait (bulk_copy.cuh), the
// wait for the copy engine, bounds its own spin the same way.
#pragma once

#include <cstdint>

#include "transport/device/flags.cuh"
#include "transport/device/team_view.hpp"

namespace epx::transport {

struct WaitSite {
  WaitPhase phase;
  int32_t peer;     // whom we wait for, -1 if not one peer
  uint32_t detail;  // phase-specific (slot, channel, iteration)
};

// Records an expired wait in the team's report (first one wins; see WaitReport) and marks the team failed.
__device__ inline void report_timeout(const TeamView& team, const WaitSite& site, uint64_t expected, uint64_t observed,
                                      uint64_t waited_ns) {
  WaitReport* r = team.report;
  if (atomicCAS(&r->claimed, 0u, 1u) != 0u) {  // another wait reports: fail the team here too, at once
    atomicExch(&team.control_of(team.rank)->failed, 1u);
    return;
  }
  r->rank = team.rank;
  r->peer = site.peer;
  r->phase = static_cast<uint32_t>(site.phase);
  r->detail = site.detail;
  r->expected = expected;
  r->observed = observed;
  r->waited_ns = waited_ns;
  atomicExch(&team.control_of(team.rank)->failed, 1u);
  __threadfence_system();
  atomicExch(&r->complete, 1u);
}

// Whether a wait of this rank's team has expired (then its kernels stop and signal nothing more).
__device__ inline bool team_failed(const TeamView& team) {
  return load_relaxed_sys(&team.control_of(team.rank)->failed) != 0u;
}

// A decision of a whole-warp wait (kWholeWarp below): lane 0's, on every lane.
template <bool kWholeWarp>
__device__ inline bool warp_wide(bool x) {
  if constexpr (kWholeWarp) x = __shfl_sync(~0u, x, 0);
  return x;
}

// Spins until arrived() (which polls what the caller waits for). Returns false, having recorded why
// (`expected` and observed() are what the report shows as awaited and seen), when the team's timeout
// expires or another wait of this team has already expired. Callers must then stop their work and
// return: the team is failed.
//
// With `give_up` (the LL rank mask of the peer waited for): the wait also returns false once *give_up is
// nonzero (another wait masked the peer, or the host did), and on expiry it sets *give_up = 1 instead
// of failing the team; the caller goes on without that peer.
//
// kWholeWarp: every lane of a warp calls it together, and arrived() (which may use warp collectives)
// returns the same on every lane; the periodic checks are then lane 0's, so that all lanes stop in the
// same round and none is left alone in a collective.
template <bool kWholeWarp = false, typename Arrived, typename Observed>
__device__ bool spin_until(const TeamView& team, Arrived arrived, uint64_t expected, Observed observed,
                           const WaitSite& site, uint32_t* give_up = nullptr) {
  // The clock and the failure word are read only every 1024 spins (they are slower than what is polled);
  // the clock starts at the first such read, so the bound is the timeout plus at most 1024 spins.
  uint64_t start = 0;
  for (uint32_t spin = 1;; ++spin) {
    if (arrived()) return true;
    if ((spin & 1023u) == 0u) {
      const uint64_t now = global_timer_ns();
      if (start == 0) start = now;
      if (warp_wide<kWholeWarp>(now - start > team.timeout_ns)) {
        if (give_up != nullptr) {
          atomicExch(give_up, 1u);
        } else {
          report_timeout(team, site, expected, observed(), now - start);
        }
        return false;
      }
      if (warp_wide<kWholeWarp>(team_failed(team) || (give_up != nullptr && load_relaxed_sys(give_up) != 0u)))
        return false;
    }
  }
}

// spin_until for one flag: spins until reached(*flag), then returns with acquire semantics (system
// scope): what the writer published before its release is visible.
//
// The spin polls with relaxed loads, which are cheaper than acquire loads; once the value is there, one
// acquire load of the same flag orders what follows (the writers only move a flag on to values that
// still satisfy the waiter, so the acquire load sees one too).
template <typename Reached>
__device__ bool wait_until(const TeamView& team, const uint64_t* flag, Reached reached, uint64_t expected,
                           const WaitSite& site, uint32_t* give_up = nullptr) {
  if (reached(load_acquire_sys(flag))) return true;
  const auto relaxed = [flag] { return load_relaxed_sys(flag); };
  if (!spin_until(
          team, [&] { return reached(relaxed()); }, expected, relaxed, site, give_up))
    return false;
  load_acquire_sys(flag);
  return true;
}

// Spins until *flag >= expected: a counter that only grows (see wait_until).
__device__ inline bool wait_at_least(const TeamView& team, const uint64_t* flag, uint64_t expected,
                                     const WaitSite& site, uint32_t* give_up = nullptr) {
  return wait_until(
      team, flag, [expected](uint64_t v) { return v >= expected; }, expected, site, give_up);
}

}  // namespace epx::transport
