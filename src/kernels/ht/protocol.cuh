// The two protocol steps every HT kernel shares (the flags are core::HtFlag; see each kernel's header
// comment for who signals what).
#pragma once

#include <cstdint>

#include "kernels/ht/ht_view.hpp"
#include "transport/device/flags.cuh"
#include "transport/device/wait.cuh"

namespace epx::kernels::ht {

// Whether a wait of this rank's team has expired (then its kernels stop and signal nothing more).
__device__ inline bool team_failed(const transport::TeamView& team) {
  return transport::load_relaxed_sys(&team.report->claimed) != 0u;
}

// The whole CTA waits (acquire) until this rank's flag[kind][r] >= seq for every rank r; thread r waits
// for rank r. Returns false on every thread when a wait expired (the team is failed).
__device__ inline bool wait_for_every_rank(const BufferView& b, int kind, uint64_t seq, transport::WaitPhase phase) {
  bool ok = true;
  for (int r = threadIdx.x; r < b.team.nranks; r += blockDim.x) {
    ok = ok && transport::wait_at_least(b.team, b.flag(b.team.rank, kind, r), seq, transport::WaitSite{phase, r, 0});
  }
  return __syncthreads_and(ok);
}

// Called by every thread of every CTA once its own stores are issued. Each CTA: __syncthreads; thread 0
// fences (system scope) and adds one to `blocks_done`, a private counter. The CTA that brings it to
// gridDim.x is the last: it resets the counter, runs `before_signal` (thread 0), fences again and adds
// 1 to flag[kind][me] on every rank (release). The fences chain every CTA's stores before those
// releases. Returns true on every thread of the last CTA.
// A team whose wait expired on this rank signals nothing (see team_failed); then no CTA is "last".
template <typename BeforeSignal>
__device__ bool last_cta_signals(const BufferView& b, int kind, uint32_t* blocks_done, BeforeSignal before_signal) {
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    last = atomicAdd(blocks_done, 1u) == gridDim.x - 1;
    if (last) {
      *blocks_done = 0;
      before_signal();
      __threadfence_system();
      last = !team_failed(b.team);
      for (int r = 0; last && r < b.team.nranks; ++r) {
        transport::add_release_sys(b.flag(r, kind, b.team.rank), 1);
      }
    }
  }
  __syncthreads();
  return last;
}

// topk_idx[t][k] of either integer type.
__device__ inline int64_t topk_at(const void* topk, bool is_int64, int64_t row_stride, int t, int k) {
  return is_int64 ? static_cast<const int64_t*>(topk)[t * row_stride + k]
                  : static_cast<const int32_t*>(topk)[t * row_stride + k];
}

}  // namespace epx::kernels::ht
