// The protocol steps every HT kernel shares (the flags are core::HtFlag; see each kernel's header
// comment for who signals what).
#pragma once

#include <cstdint>

#include "kernels/common/grid.cuh"
#include "kernels/common/topk.cuh"
#include "kernels/ht/ht_view.hpp"
#include "transport/device/flags.cuh"
#include "transport/device/wait.cuh"

namespace epx::kernels::ht {

// Waits until a stamped word (core::stamped) carries `call`'s stamp and a value of at least `at_least`.
__device__ inline bool wait_for_stamp(const transport::TeamView& team, const uint64_t* word, uint64_t call,
                                      uint32_t at_least, const transport::WaitSite& site) {
  return transport::wait_until(
      team, word,
      [call, at_least](uint64_t v) { return core::stamped_in(v, call) && core::stamped_value(v) >= at_least; },
      core::stamped(call, at_least), site);
}

// The whole CTA waits until this rank's flag[kind][r] >= seq for every rank r (wait_for_all_ranks).
__device__ inline bool wait_for_every_rank(const BufferView& b, int kind, uint64_t seq, transport::WaitPhase phase) {
  return wait_for_all_ranks(b.team, [&](int r) {
    return transport::wait_at_least(b.team, b.flag(b.team.rank, kind, r), seq, transport::WaitSite{phase, r, 0});
  });
}

// Called by every thread of every CTA once its own stores are issued (signal_when_last). The last
// CTA's thread 0 stores sequence = seq (every CTA has read the old value by then), then adds 1 to
// flag[kind][me] on every rank (release). Returns true on every thread of the last CTA, unless the
// team has failed: a failed team signals nothing.
__device__ inline bool last_cta_signals(const BufferView& b, int kind, uint32_t* blocks_done, uint32_t* work_claimed,
                                        uint64_t* sequence, uint64_t seq) {
  return signal_when_last(
      b.team, blocks_done,
      [&] {
        *sequence = seq;
        for (int r = 0; r < b.team.nranks; ++r) transport::add_release_sys(b.flag(r, kind, b.team.rank), 1);
      },
      work_claimed);
}

}  // namespace epx::kernels::ht
