// The flag protocol both LL kernels share (flags of core::LlFlag; each kernel's header says what the
// data behind them is). Per (op, set) every flag holds the sequence number of a call (they only grow):
//   * A call's sequence number on a set is seq = freed(me, op, set, me) + 1: this rank's own receive
//     steps on the set so far, plus one (read when a kernel starts; the receive step of the previous
//     call on the set has finished by then, see ll.hpp's rules).
//   * Before a warp first writes into peers' copies of the set, it waits until every peer's
//     freed(me, op, set, peer) >= seq - 1: the peer has finished reading the set's previous use, so
//     nothing unread is overwritten, whatever the order of calls (captured graphs included).
//   * When every CTA's writes are done (last_cta_done: the last CTA, after fences, is the one that
//     signals), ready(r, op, set, me) = seq on every rank r. The receive step waits until
//     ready(me, op, set, r) >= seq for every r.
//   * When every CTA's reads are done, freed(r, op, set, me) = seq on every rank r (me included).
// Signals are system-scope release stores by one thread; waits are acquires, bounded (wait_at_least).
// One remote signal per call and peer: many CTAs adding to one remote counter serialise on it.
#pragma once

#include <cstdint>

#include "kernels/common/grid.cuh"
#include "kernels/ll/ll_view.hpp"
#include "transport/device/wait.cuh"

namespace epx::kernels::ll {

// The sequence number of the call being made on (op, set).
__device__ inline uint64_t call_sequence(const LlView& v, int op, int set) {
  return transport::load_relaxed_sys(v.flag(v.team.rank, core::kLlFreed, op, set, v.team.rank)) + 1;
}

// The whole warp waits until every peer has freed `set` of `op` after its previous use. Returns false
// on every lane when the team failed.
__device__ inline bool wait_set_free(const LlView& v, int op, int set, uint64_t seq) {
  bool ok = true;
  for (int r = threadIdx.x % kWarp; r < v.team.nranks; r += kWarp) {
    ok = ok && transport::wait_at_least(v.team, v.flag(v.team.rank, core::kLlFreed, op, set, r), seq - 1,
                                        transport::WaitSite{transport::WaitPhase::ll_set_reuse, r, uint32_t(set)});
  }
  return __all_sync(~0u, ok);
}

// The whole CTA waits until every peer's writes of the call are here (wait_for_all_ranks on "ready").
__device__ inline bool wait_every_peer(const LlView& v, int op, int set, uint64_t seq, transport::WaitPhase phase) {
  const auto ready = [&](int r) { return v.flag(v.team.rank, core::kLlReady, op, set, r); };
  return wait_for_all_ranks(v.team, ready, seq, phase, uint32_t(set));
}

// Every thread of every CTA calls it once its accesses for the step are done. The last CTA's thread 0
// sets flag `kind` about me to seq on every peer (release), unless the team failed; `before(r)` runs
// first for each peer r (a store the flag must publish too). `blocks_done` is the step's private CTA
// counter (last_cta_done).
template <typename Before>
__device__ void last_cta_signals(const LlView& v, uint32_t* blocks_done, int kind, int op, int set, uint64_t seq,
                                 Before before) {
  if (!last_cta_done(blocks_done) || threadIdx.x != 0 || team_failed(v.team)) return;
  for (int r = 0; r < v.team.nranks; ++r) {
    before(r);
    transport::store_release_sys(v.flag(r, kind, op, set, v.team.rank), seq);
  }
}

}  // namespace epx::kernels::ll
