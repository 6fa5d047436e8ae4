// HT dispatch, part 1: the count exchange ("notify"). CTA 0 of the dispatch kernel (dispatch.cu)
// announces this rank's counts; every CTA waits for every rank's and reads the count matrix itself, so
// no CTA waits for another before sending; CTA 0 also writes the results into the handle and reports
// them to the host.
//
// Protocol (`seq` is this rank's dispatch number, sequence[kDispatchDone] + 1, which the dispatch
// kernel's last CTA stores back at its end, so that graph replays advance it). Every count travels as
// a stamped word (core::stamped: the low 32 bits of seq above the value, one 8-byte store), so the words need no flag
// and no fence: a reader that sees seq's stamp (its low 32 bits) in a word has its value.
//   1. CTA 0 (announce_counts), to every rank d: my tokens per rank and my status into d's
//      notify_counts[me][*], my tokens per expert of d into d's notify_expert_counts[me][*].
//      Cached form: only the status word ("I am in this dispatch").
//   2. Every CTA (wait_for_counts): its threads wait until every word it reads carries seq's stamp: the
//      count matrix (cached: each source's status word), and in CTA 0 the expert counts; __syncthreads.
// d's step-1 words also tell every source, which sees them in its step 2, that d's stream has finished
// with the previous dispatch's outputs (d announces from the dispatch kernel, which starts after its
// earlier work): what makes writing the new rows into d's receive area safe.
//   3. Every CTA reads what it needs from the count matrix (failed_source, rows_before): whether any
//      rank's input failed (then the whole dispatch is a no-op on every rank, reported by the host)
//      and where my rows start on each rank. CTA 0 also writes the handle (count_exchange_results):
//      send_begin, recv_begin, N, the rows per local expert, the count matrix and the status. Cached
//      form: all of it is in the handle already.
//   4. CTA 0 (report_counts_to_host): N and the expert counts go to the host mailbox (HostMailbox),
//      then ready = the call's ticket. Not after a failed step 2: the host learns of it from the team.
#pragma once

#include "kernels/ht/launch.hpp"
#include "kernels/ht/protocol.cuh"
#include "transport/device/wait.cuh"

namespace epx::kernels::ht {

// The count matrix as this rank received it, after step 2: source s's tokens for rank j (j < R), and
// its status (j == R, nonzero: its input was invalid: an expert id the layout kernel refused, or more
// tokens than the buffer holds, refused on the host, which then sends none).
__device__ inline int32_t count_at(const BufferView& b, int s, int j) {
  return int32_t(core::stamped_value(b.at<uint64_t>(b.team.rank, b.notify_counts)[s * b.notify_stride() + j]));
}

// The first source whose input failed, or -1.
__device__ inline int failed_source(const BufferView& b) {
  const int R = b.team.nranks;
  for (int s = 0; s < R; ++s) {
    if (count_at(b, s, R) != 0) return s;
  }
  return -1;
}

// Where my rows start on rank d: the tokens the ranks before me send there.
__device__ inline int32_t rows_before(const BufferView& b, int d) {
  int32_t before = 0;
  for (int s = 0; s < b.team.rank; ++s) before += count_at(b, s, d);
  return before;
}

// N: the tokens every source sends me.
__device__ inline int32_t rows_from_every_source(const BufferView& b) {
  int32_t n = 0;
  for (int s = 0; s < b.team.nranks; ++s) n += count_at(b, s, b.team.rank);
  return n;
}

// Step 3 for the handle (not cached), by every thread of CTA 0: offsets and counts from the count matrix.
__device__ inline void count_exchange_results(const DispatchArgs& a) {
  const BufferView& b = a.buffer;
  const int R = b.team.nranks, me = b.team.rank, E_local = b.experts_per_rank();
  __shared__ int32_t failed_rank;
  if (threadIdx.x == 0) {  // R <= 72: a few thousand additions at most
    failed_rank = failed_source(b);
    int32_t begin = 0;
    for (int s = 0; s < R; ++s) {
      a.handle.recv_begin[s] = begin;
      begin += failed_rank < 0 ? count_at(b, s, me) : 0;
    }
    a.handle.recv_begin[R] = begin;  // rows_from_every_source, or 0 after a failed input
    for (int d = 0; d < R; ++d) a.handle.send_begin[d] = rows_before(b, d);
    *a.handle.status = failed_rank < 0 ? 0 : 1 + failed_rank;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < R * R; i += blockDim.x) {
    a.handle.count_matrix[i] = failed_rank < 0 ? count_at(b, i / R, i % R) : 0;
  }
  const uint64_t* expert_counts = b.at<uint64_t>(me, b.notify_expert_counts);  // [s][E_local]
  for (int j = threadIdx.x; j < E_local; j += blockDim.x) {
    int32_t n = 0;
    for (int s = 0; s < R && failed_rank < 0; ++s) n += int32_t(core::stamped_value(expert_counts[s * E_local + j]));
    a.handle.expert_counts[j] =
        (n + a.counts.expert_alignment - 1) / a.counts.expert_alignment * a.counts.expert_alignment;
  }
}

// Step 1, by every thread of CTA 0 (seq: this dispatch's number).
__device__ inline void announce_counts(const DispatchArgs& a, uint64_t seq) {
  const BufferView& b = a.buffer;
  const CountExchangeArgs& c = a.counts;
  const int R = b.team.nranks, me = b.team.rank, E_local = b.experts_per_rank();
  const int stride = b.notify_stride();
  __shared__ int32_t status;
  if (threadIdx.x == 0) {
    status = (!c.cached && (c.refused || a.handle.input_error->found)) ? 1 : 0;
    if (status != 0 && a.handle.input_error->found) {
      if (c.mailbox->input.found == 0) c.mailbox->input = *a.handle.input_error;
      *a.handle.input_error = InputError{};  // read once: the handle block starts clean for its next dispatch
    }
  }
  __syncthreads();
  if (c.cached) {
    for (int d = threadIdx.x; d < R; d += blockDim.x) {
      transport::store_relaxed_sys(b.at<uint64_t>(d, b.notify_counts) + me * stride + R, core::stamped(seq, 0));
    }
    return;
  }
  for (int i = threadIdx.x; i < R * stride; i += blockDim.x) {
    const int d = i / stride, j = i % stride;
    const int32_t value = j < R ? a.handle.rank_counts[j] : status;
    transport::store_relaxed_sys(b.at<uint64_t>(d, b.notify_counts) + me * stride + j,
                                 core::stamped(seq, uint32_t(value)));
  }
  for (int i = threadIdx.x; i < R * E_local; i += blockDim.x) {
    const int d = i / E_local, j = i % E_local;
    transport::store_relaxed_sys(b.at<uint64_t>(d, b.notify_expert_counts) + me * E_local + j,
                                 core::stamped(seq, uint32_t(a.handle.expert_totals[d * E_local + j])));
  }
}

// Step 2, by every thread of a CTA: true once every word the CTA reads carries seq (the same on every
// thread); false when a wait expired (the team has failed). The words of source s name s when a wait
// expires.
__device__ inline bool wait_for_counts(const BufferView& b, uint64_t seq, bool cached, bool expert_counts) {
  const int R = b.team.nranks, me = b.team.rank, stride = b.notify_stride(), E_local = b.experts_per_rank();
  const uint64_t* counts = b.at<uint64_t>(me, b.notify_counts);
  const uint64_t* experts = b.at<uint64_t>(me, b.notify_expert_counts);
  const auto heard = [&](const uint64_t* word, int source) {
    return wait_for_stamp(b.team, word, seq, 0, transport::WaitSite{transport::WaitPhase::ht_notify, source, 0});
  };
  bool ok = true;
  if (cached) {
    for (int s = threadIdx.x; ok && s < R; s += blockDim.x) ok = heard(counts + s * stride + R, s);
  } else {
    for (int i = threadIdx.x; ok && i < R * stride; i += blockDim.x) ok = heard(counts + i, i / stride);
    for (int i = threadIdx.x; ok && expert_counts && i < R * E_local; i += blockDim.x)
      ok = heard(experts + i, i / E_local);
  }
  return __syncthreads_and(ok);
}

// Step 4, by every thread of CTA 0 after step 3: N and the expert counts to the host mailbox (writes
// over PCIe and a system fence), then ready = the ticket.
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
