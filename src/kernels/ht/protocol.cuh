// The protocol steps every HT kernel shares (the done signals are core::HtFlag; see each kernel's header
// comment for what its signal covers).
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

// ---- "Done" signals (core::HtFlag, in the done words of core::HtAreas) ----
// Who writes: CTA c of rank s's kernel for call seq, once the accesses its signal covers are done (a
// dispatch CTA: its row and metadata stores; a combine CTA: its reads of the peers' combine input).
// Thread 0 makes them visible with a system fence (__threadfence_system, after a CTA barrier) and then
// stores done_word(r, kind, s, c) = stamped(seq, gridDim.x) on every rank r, relaxed: fence and store
// together are a release. No CTA waits for another before it signals.
// Who waits: the CTA of rank r that counts itself last (last_cta_done). Thread i waits for source
// (i % R)'s words c = i / R, i / R + P, ... below the grid size that word 0 carries, polling word 0
// with each word (P = max(1, min(blockDim.x / R, gridDim.x))). Once a word shows its stamp, an acquire
// load of it orders what its CTA did before, and the CTA barrier that follows orders it for every thread.
// What a word can hold while r waits for call seq: an earlier call's stamp, seq's, or seq + 1's (a
// combine CTA that reads nothing of r signals without waiting for r, so s may be in its next call
// already; never seq + 2, which needs r's signals of seq + 1). seq + 1 in word c counts as seq's signal
// too, and in word 0 as all of them: s started its next call of the op only after its kernel for seq,
// every CTA of which had signalled, had ended. A word's value, the grid size, is never 0, so a word never
// written (0) is never taken for a signal; a word last written in an older call with a larger grid
// holds that call's stamp (the stamps' limits: core/ht_areas.hpp).

// Called by every thread of every CTA once the accesses its signal covers are issued and waited for.
// Signals `kind` to every rank (above), unless the team has failed: a failed team signals nothing (its
// stores may be incomplete, and its peers then time out themselves instead of taking them as done).
// Then counts the CTA (last_cta_done), so that the last CTA may reset the kernel's private words
// (blocks_done, work_claimed) and store the call number. Returns true on every thread of the last CTA,
// unless the team had failed when its thread 0 looked.
__device__ inline bool signal_done(const BufferView& b, int kind, uint64_t seq, uint32_t* blocks_done,
                                   uint32_t* work_claimed = nullptr) {
  __shared__ bool failed;
  __syncthreads();
  if (threadIdx.x == 0) {
    // Read after the barrier, so that a wait of this CTA that expired before it stops the signal (every
    // expired wait sets the word before it returns).
    failed = transport::team_failed(b.team);
    __threadfence_system();
    if (!failed) {
      for (int r = 0; r < b.team.nranks; ++r)
        transport::store_relaxed_sys(b.done_word(r, kind, b.team.rank, blockIdx.x), core::stamped(seq, gridDim.x));
    }
  }
  const bool last = last_cta_done(blocks_done, work_claimed);  // its barriers publish `failed`
  return last && !failed;
}

// The whole CTA waits until every CTA of every rank has signalled `kind` for call seq to this rank
// (above). Returns false on every thread when a wait expired or the team failed.
__device__ inline bool wait_for_every_cta(const BufferView& b, int kind, uint64_t seq, transport::WaitPhase phase) {
  // Pollers per source: one per CTA where the sources run grids of this kernel's size (as they do with one
  // config on every rank), so that no more threads than words poll; any grid size is waited for alike.
  const int R = b.team.nranks, pollers = max(1, min(int(blockDim.x) / R, int(gridDim.x)));
  // A signal carries its CTA's grid size, never 0: a word never written (0) is none, whatever its stamp.
  const auto signalled = [seq](uint64_t word) {
    return core::stamped_value(word) != 0u && (core::stamped_in(word, seq) || core::stamped_in(word, seq + 1));
  };
  bool ok = true;
  for (int i = threadIdx.x; ok && i < R * pollers; i += blockDim.x) {
    const int r = i % R;
    const uint64_t* words = b.done_word(b.team.rank, kind, r, 0);
    for (int c = i / R;; c += pollers) {
      bool next_call = false;  // word 0 shows seq + 1
      uint32_t ctas = 0;       // r's grid size for seq, once word 0 shows it
      const auto arrived = [&] {
        const uint64_t first = transport::load_relaxed_sys(words);
        if (!signalled(first)) return false;
        next_call = core::stamped_in(first, seq + 1);
        if (next_call) return true;
        ctas = min(core::stamped_value(first), uint32_t(core::kMaxCtas));  // a source's grid is at most that
        return c >= int(ctas) || signalled(transport::load_relaxed_sys(words + c));
      };
      const auto observed = [&] { return transport::load_relaxed_sys(words + c); };  // the site names CTA c
      ok = transport::spin_until(b.team, arrived, core::stamped(seq, 1), observed,
                                 transport::WaitSite{phase, r, uint32_t(c)});
      if (!ok || (!next_call && c >= int(ctas))) break;
      transport::load_acquire_sys(next_call ? words : words + c);
      if (next_call) break;
    }
  }
  return __syncthreads_and(ok);
}

}  // namespace epx::kernels::ht
