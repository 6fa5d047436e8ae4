// HT dispatch, part 1: the count exchange ("notify"), run by CTA 0 of the dispatch kernel
// (dispatch.cu) while the other CTAs load their first rows and wait for its result.
//
// Protocol (flags of core::HtFlag, in the receiving rank's control area; `seq` is this rank's dispatch
// number, sequence[kDispatchNotify] + 1, which the dispatch kernel's last CTA stores back at its end, so
// that graph replays advance it):
//   1. To every rank d: write my tokens-per-rank vector and my status into d's notify_counts[me][*],
//      and my tokens per expert of d into d's notify_expert_counts[me][*]; __syncthreads; thread d
//      adds 1 to d's flag[kDispatchNotify][me] (system-scope release).
//      Cached form: no counts, only the add ("I am in this dispatch").
//   2. Thread s waits (acquire) until my flag[kDispatchNotify][s] >= seq.
// Reaching step 2 on rank d also tells every source that d's stream has finished with the previous
// dispatch's outputs, which is what makes writing the new rows into d's receive area safe.
//   3. From the count matrix: where my rows start on each rank (send_begin), where each source's rows
//      start here (recv_begin), N, and the rows per local expert. A failed input on any rank turns
//      the whole dispatch into a no-op on every rank (status), reported by the host.
//   4. Once the dispatch kernel has told its other CTAs that the offsets are in the handle (they need
//      not wait for host memory): N and the expert counts go to the host mailbox (HostMailbox), then
//      ready = the call's ticket. Not after a failed step 2: the host learns of it from the team.
#pragma once

#include "kernels/ht/launch.hpp"
#include "kernels/ht/protocol.cuh"
#include "transport/device/wait.cuh"

namespace epx::kernels::ht {

// Step 3 (not cached): offsets and counts from the exchanged count matrix, into the handle.
__device__ inline void count_exchange_results(const DispatchArgs& a) {
  const BufferView& b = a.buffer;
  const int R = b.team.nranks, me = b.team.rank, E_local = b.experts_per_rank();
  const int stride = b.notify_stride();
  const int32_t* counts = b.at<int32_t>(me, b.notify_counts);  // [s][stride]
  __shared__ int32_t failed_rank;
  if (threadIdx.x == 0) {  // R <= 72: a few thousand additions at most
    failed_rank = -1;
    for (int s = 0; s < R && failed_rank < 0; ++s) {
      if (counts[s * stride + R] != 0) failed_rank = s;
    }
    int32_t begin = 0;
    for (int s = 0; s < R; ++s) {
      a.handle.recv_begin[s] = begin;
      begin += failed_rank < 0 ? counts[s * stride + me] : 0;
    }
    a.handle.recv_begin[R] = begin;
    for (int d = 0; d < R; ++d) {
      int32_t before = 0;
      for (int s = 0; s < me; ++s) before += counts[s * stride + d];
      a.handle.send_begin[d] = before;
    }
    *a.handle.status = failed_rank < 0 ? 0 : 1 + failed_rank;
  }
  __syncthreads();
  const int32_t* expert_counts = b.at<int32_t>(me, b.notify_expert_counts);  // [s][E_local]
  for (int j = threadIdx.x; j < E_local; j += blockDim.x) {
    int32_t n = 0;
    for (int s = 0; s < R && failed_rank < 0; ++s) n += expert_counts[s * E_local + j];
    a.handle.expert_counts[j] =
        (n + a.counts.expert_alignment - 1) / a.counts.expert_alignment * a.counts.expert_alignment;
  }
}

// Steps 1 to 3, by every thread of one CTA. On return the handle holds the offsets and the status
// (kStatusTeamFailed when a wait expired: nothing may be sent; the result is then false, the same on
// every thread, and there is nothing to report to the host).
__device__ inline bool exchange_counts(const DispatchArgs& a, uint64_t seq) {
  const BufferView& b = a.buffer;
  const CountExchangeArgs& c = a.counts;
  const int R = b.team.nranks, me = b.team.rank, E_local = b.experts_per_rank();
  __shared__ int32_t status;
  if (threadIdx.x == 0) {
    status = (!c.cached && a.handle.input_error->found) ? 1 : 0;
    if (status != 0) {
      if (c.mailbox->input.found == 0) c.mailbox->input = *a.handle.input_error;
      *a.handle.input_error = InputError{};  // read once: the handle block starts clean for its next dispatch
    }
  }
  __syncthreads();

  if (!c.cached) {
    const int stride = b.notify_stride();
    for (int i = threadIdx.x; i < R * stride; i += blockDim.x) {
      const int d = i / stride, j = i % stride;
      b.at<int32_t>(d, b.notify_counts)[me * stride + j] = j < R ? a.handle.rank_counts[j] : status;
    }
    for (int i = threadIdx.x; i < R * E_local; i += blockDim.x) {
      const int d = i / E_local, j = i % E_local;
      b.at<int32_t>(d, b.notify_expert_counts)[me * E_local + j] = a.handle.expert_totals[d * E_local + j];
    }
  }
  __syncthreads();  // every write above before the releases below
  for (int d = threadIdx.x; d < R; d += blockDim.x) transport::add_release_sys(b.flag(d, core::kDispatchNotify, me), 1);
  if (!wait_for_every_rank(b, core::kDispatchNotify, seq, transport::WaitPhase::ht_notify)) {
    if (threadIdx.x == 0) *a.handle.status = kStatusTeamFailed;  // the host reports the expired wait
    __syncthreads();
    return false;
  }
  if (!c.cached) count_exchange_results(a);
  return true;
}

// Step 4, by every thread of the CTA that ran exchange_counts, once the other CTAs have been told: N and
// the expert counts to the host mailbox (writes over PCIe and a system fence), then ready = the ticket.
__device__ inline void report_counts_to_host(const DispatchArgs& a) {
  const CountExchangeArgs& c = a.counts;
  const int R = a.buffer.team.nranks, E_local = a.buffer.experts_per_rank();
  HostMailbox* m = c.mailbox;
  for (int j = threadIdx.x; j < E_local; j += blockDim.x) m->expert_counts[j] = a.handle.expert_counts[j];
  __syncthreads();
  if (threadIdx.x == 0) {
    const int32_t num_recv = a.handle.recv_begin[R];
    const int32_t failed = *a.handle.status - 1;
    if (failed >= 0 && m->failed_rank < 0) m->failed_rank = failed;
    if (c.num_worst_tokens > 0 && num_recv > c.num_worst_tokens && m->overflow == 0) m->overflow = num_recv;
    m->num_recv = num_recv;
    __threadfence_system();
    atomicExch(&m->ready, c.ticket);
  }
}

}  // namespace epx::kernels::ht
