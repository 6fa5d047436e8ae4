// HT dispatch, step 1: the count exchange ("notify"), one CTA per rank.
//
// Protocol (flags of core::HtFlag, in the receiving rank's control area):
//   1. seq = ++sequence[kDispatchNotify] (this rank's dispatch number; on the device so that graph
//      replays advance it).
//   2. To every rank d: write my tokens-per-rank vector and my status into d's notify_counts[me][*],
//      and my tokens per expert of d into d's notify_expert_counts[me][*]; __syncthreads; thread d
//      adds 1 to d's flag[kDispatchNotify][me] (system-scope release).
//      Cached form: no counts, only the add ("I am in this dispatch").
//   3. Thread s waits (acquire) until my flag[kDispatchNotify][s] >= seq.
// Reaching step 3 on rank d also tells every source that d's stream has finished with the previous
// dispatch's outputs, which is what makes writing the new rows into d's receive area safe.
//   4. From the count matrix: where my rows start on each rank (send_begin), where each source's rows
//      start here (recv_begin), N, and the rows per local expert. A failed input on any rank turns
//      the whole dispatch into a no-op on every rank (status), reported by the host.
//   5. Worst-case form: padding rows [N, num_worst) get src_idx -1, topk_idx -1, weights 0.
//   6. N and the expert counts go to the host mailbox (HostMailbox), then ready = the call's ticket.

#include "core/cuda_check.hpp"
#include "kernels/ht/launch.hpp"
#include "kernels/ht/protocol.cuh"
#include "transport/device/wait.cuh"

namespace epx::kernels::ht {
namespace {

constexpr int kThreads = 512;

// Step 4 (not cached): offsets and counts from the exchanged count matrix, into the handle.
__device__ void count_exchange_results(const NotifyArgs& a) {
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
    a.handle.expert_counts[j] = (n + a.expert_alignment - 1) / a.expert_alignment * a.expert_alignment;
  }
}

// Step 5: worst-case padding rows say "no token" (x is left as it is).
__device__ void fill_padding_rows(const BufferView& b, int32_t num_recv, int64_t num_worst, int topk, bool topk_int64) {
  const int me = b.team.rank;
  int32_t* src_idx = b.at<int32_t>(me, b.recv_src_idx);
  float* weights = b.at<float>(me, b.recv_topk_weights);
  for (int64_t i = num_recv + threadIdx.x; i < num_worst; i += blockDim.x) {
    src_idx[i] = -1;
    for (int k = 0; k < topk; ++k) {
      if (topk_int64) {
        b.at<int64_t>(me, b.recv_topk_idx)[i * topk + k] = -1;
      } else {
        b.at<int32_t>(me, b.recv_topk_idx)[i * topk + k] = -1;
      }
      weights[i * topk + k] = 0.0f;
    }
  }
}

__global__ void __launch_bounds__(kThreads) notify_kernel(NotifyArgs a) {
  const BufferView& b = a.buffer;
  const int R = b.team.nranks, me = b.team.rank, E_local = b.experts_per_rank();
  __shared__ uint64_t seq;
  __shared__ int32_t status;
  if (threadIdx.x == 0) {
    uint64_t* sequence = b.at<uint64_t>(me, b.sequence) + core::kDispatchNotify;
    seq = *sequence + 1;
    *sequence = seq;
    status = (!a.cached && a.handle.input_error->found) ? 1 : 0;
    if (status != 0) {
      if (a.mailbox->input.found == 0) a.mailbox->input = *a.handle.input_error;
      *a.handle.input_error = InputError{};  // read once: the handle block starts clean for its next dispatch
    }
  }
  __syncthreads();

  if (!a.cached) {
    const int layout_ctas = (a.num_tokens + kLayoutTokensPerCta - 1) / kLayoutTokensPerCta;
    const int stride = b.notify_stride();
    for (int i = threadIdx.x; i < R * stride; i += blockDim.x) {
      const int d = i / stride, j = i % stride;
      b.at<int32_t>(d, b.notify_counts)[me * stride + j] = j < R ? a.handle.rank_counts[j] : status;
    }
    for (int i = threadIdx.x; i < R * E_local; i += blockDim.x) {
      const int d = i / E_local, j = i % E_local;
      int32_t n = 0;  // this rank's tokens naming expert d * E_local + j, summed over the layout CTAs
      for (int h = 0; h < layout_ctas; ++h) n += a.handle.expert_partials[int64_t(h) * b.num_experts + d * E_local + j];
      b.at<int32_t>(d, b.notify_expert_counts)[me * E_local + j] = n;
    }
  }
  __syncthreads();  // every write above before the releases below
  for (int d = threadIdx.x; d < R; d += blockDim.x) transport::add_release_sys(b.flag(d, core::kDispatchNotify, me), 1);
  if (!wait_for_every_rank(b, core::kDispatchNotify, seq, transport::WaitPhase::ht_notify)) {
    if (threadIdx.x == 0) *a.handle.status = kStatusTeamFailed;  // dispatch_send then sends nothing
    return;                                                      // the host reports the expired wait
  }
  if (!a.cached) count_exchange_results(a);
  __syncthreads();
  const int32_t num_recv = a.handle.recv_begin[R];
  if (a.num_worst_tokens > 0) fill_padding_rows(b, num_recv, a.num_worst_tokens, a.topk, a.topk_int64);
  HostMailbox* m = a.mailbox;
  for (int j = threadIdx.x; j < E_local; j += blockDim.x) m->expert_counts[j] = a.handle.expert_counts[j];
  __syncthreads();
  if (threadIdx.x == 0) {
    const int32_t failed = *a.handle.status - 1;
    if (failed >= 0 && m->failed_rank < 0) m->failed_rank = failed;
    if (a.num_worst_tokens > 0 && num_recv > a.num_worst_tokens && m->overflow == 0) m->overflow = num_recv;
    m->num_recv = num_recv;
    __threadfence_system();
    atomicExch(&m->ready, a.ticket);
  }
}

}  // namespace

void launch_notify(const NotifyArgs& args, cudaStream_t stream) {
  notify_kernel<<<1, kThreads, 0, stream>>>(args);
  detail::check_launch("ht notify_kernel");
}

void load_notify_kernel() { detail::load_kernel(reinterpret_cast<const void*>(notify_kernel), "HT notify kernel"); }

}  // namespace epx::kernels::ht
