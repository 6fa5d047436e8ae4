// HT layout: from topk_idx, each token's ranks and experts.
//
// Grid: R "rank" CTAs, then ceil(T / kThreads) "histogram" CTAs.
//  * Rank CTA r walks the tokens in tiles of kThreads; a token goes to r if any of its experts lives
//    there. A block-wide exclusive scan gives its position among the tokens for r (send_pos), the
//    running total gives rank_counts[r].
//  * Histogram CTA h counts, for its kThreads tokens, the tokens naming each expert (a token naming an
//    expert twice counts once) in shared memory, then writes them as its row of expert_partials, or
//    adds them to expert_token_counts, which the caller has zeroed. It also checks the ids: one outside [-1, E) is
//    recorded in `error` (first one wins) and ignored; the count exchange turns it into a failed call on every rank.
#include <cub/block/block_scan.cuh>

#include "core/cuda_check.hpp"
#include "kernels/ht/launch.hpp"
#include "kernels/ht/protocol.cuh"

namespace epx::kernels::ht {
namespace {

constexpr int kThreads = kLayoutTokensPerCta;  // one token per thread in the histogram CTAs

__device__ void record_error(InputError* error, int t, int k, int64_t value) {
  if (error == nullptr || atomicCAS(&error->found, 0, 1) != 0) return;
  error->token = t;
  error->slot = k;
  error->value = value;
  __threadfence_system();
}

__global__ void __launch_bounds__(kThreads)
    layout_kernel(const void* topk, bool is_int64, int64_t row_stride, int num_tokens, int topk_n, int num_ranks,
                  int num_experts, LayoutOutputs out) {
  const int experts_per_rank = num_experts / num_ranks;
  if (blockIdx.x < num_ranks) {
    using Scan = cub::BlockScan<int, kThreads>;
    __shared__ typename Scan::TempStorage scan_storage;
    const int r = blockIdx.x;
    const int64_t first = int64_t(r) * experts_per_rank, last = first + experts_per_rank;
    int total = 0;
    for (int tile = 0; tile < num_tokens; tile += kThreads) {
      const int t = tile + threadIdx.x;
      int in_rank = 0;
      if (t < num_tokens) {
        for (int k = 0; k < topk_n; ++k) {
          const int64_t e = topk_at(topk, is_int64, row_stride, t, k);
          in_rank |= e >= first && e < last;
        }
      }
      int position, tile_total;
      Scan(scan_storage).ExclusiveSum(in_rank, position, tile_total);
      if (t < num_tokens) {
        if (out.send_pos != nullptr) out.send_pos[t * num_ranks + r] = in_rank ? total + position : -1;
        if (out.is_token_in_rank != nullptr) out.is_token_in_rank[t * num_ranks + r] = in_rank;
      }
      total += tile_total;
      __syncthreads();  // scan_storage is reused by the next tile
    }
    if (threadIdx.x == 0) out.rank_counts[r] = total;
    return;
  }
  extern __shared__ int counts[];  // [num_experts]
  for (int e = threadIdx.x; e < num_experts; e += kThreads) counts[e] = 0;
  __syncthreads();
  const int t = (blockIdx.x - num_ranks) * kThreads + threadIdx.x;
  if (t < num_tokens) {
    for (int k = 0; k < topk_n; ++k) {
      const int64_t e = topk_at(topk, is_int64, row_stride, t, k);
      if (e < -1 || e >= num_experts) record_error(out.error, t, k, e);
      if (e < 0 || e >= num_experts) continue;
      bool repeated = false;
      for (int j = 0; j < k; ++j) repeated |= topk_at(topk, is_int64, row_stride, t, j) == e;
      if (!repeated) atomicAdd(&counts[e], 1);
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < num_experts; e += kThreads) {
    if (out.expert_partials != nullptr) {
      out.expert_partials[int64_t(blockIdx.x - num_ranks) * num_experts + e] = counts[e];
    } else if (counts[e] != 0) {
      atomicAdd(&out.expert_token_counts[e], counts[e]);
    }
  }
}

}  // namespace

void launch_layout(const void* topk_idx, bool topk_int64, int64_t topk_row_stride, int num_tokens, int topk,
                   int num_ranks, int num_experts, const LayoutOutputs& out, cudaStream_t stream) {
  const int blocks = num_ranks + (num_tokens + kThreads - 1) / kThreads;
  const std::size_t histogram_bytes = sizeof(int) * num_experts;
  layout_kernel<<<blocks, kThreads, histogram_bytes, stream>>>(topk_idx, topk_int64, topk_row_stride, num_tokens, topk,
                                                               num_ranks, num_experts, out);
  detail::check_launch("ht layout_kernel");
}

void load_layout_kernel() { detail::load_kernel(reinterpret_cast<const void*>(layout_kernel), "HT layout kernel"); }

}  // namespace epx::kernels::ht
