// HT dispatch, step 2: every row goes straight to its final place in each receiver's receive area.
//
// Work split: warp w of the grid takes tokens w, w + warps, ... . For a token it looks up, per
// destination rank d, the row (send_begin[d] + send_pos[t][d], or none), then streams the token's row
// through registers once and stores it to every destination (most tokens go to several ranks, so the
// row is read from memory once). Lanes also write the row's metadata: src_idx, topk_idx rewritten to
// d's local expert ids (-1 elsewhere), weights (0 where -1) and, for FP8, the row's scales.
//
// Protocol:
//   * Before this kernel, notify made sure every destination is in this dispatch (so its receive area
//     is free) and computed the rows.
//   * Each CTA: its stores; __syncthreads; thread 0: system fence, then one add to `blocks_done` (a
//     private counter). The CTA that brings it to gridDim.x is the last: it resets the counter and,
//     after another system fence, adds 1 to flag[kDispatchDone][me] on every rank d (release). The
//     fences chain every CTA's stores before those releases.
//   * The last CTA then waits (acquire) until its own flag[kDispatchDone][s] >= seq for every source s:
//     when the kernel ends, every row of this dispatch has arrived here. Unless cached, it copies the
//     rows' src_idx into the handle (combine needs them after later dispatches reuse the receive area).
#include "core/cuda_check.hpp"
#include "kernels/ht/copy.cuh"
#include "kernels/ht/launch.hpp"
#include "transport/device/wait.cuh"

namespace epx::kernels::ht {
namespace {

constexpr int kThreads = 1024;  // 32 warps: more rows in flight per SM (the send is latency-bound)
constexpr int kWarpsPerCta = kThreads / kWarp;
constexpr int kMaxRanks = kMaxNvlinkRanks;

__device__ int64_t load_topk(const TokensView& in, int t, int k) {
  return in.topk_int64 ? static_cast<const int64_t*>(in.topk_idx)[t * in.topk_row_stride + k]
                       : static_cast<const int32_t*>(in.topk_idx)[t * in.topk_row_stride + k];
}

// Streams `bytes` from src to the destinations whose row (in `rows`) is >= 0.
__device__ void copy_to_destinations(const uint8_t* src, int bytes, const BufferView& b, const int32_t* rows,
                                     int row_bytes, int lane) {
  const int R = b.team.nranks;
  const int4* s = reinterpret_cast<const int4*>(src);
  const int n = bytes / 16;
  for (int base = 0; base < n; base += kWarp * kCopyUnroll) {
    int4 v[kCopyUnroll];
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      const int i = base + u * kWarp + lane;
      if (i < n) v[u] = load_stream(s + i);
    }
    for (int d = 0; d < R; ++d) {
      if (rows[d] < 0) continue;
      int4* dst = reinterpret_cast<int4*>(b.at<uint8_t>(d, b.recv_x) + int64_t(rows[d]) * row_bytes);
#pragma unroll
      for (int u = 0; u < kCopyUnroll; ++u) {
        const int i = base + u * kWarp + lane;
        if (i < n) dst[i] = v[u];
      }
    }
  }
}

__global__ void __launch_bounds__(kThreads) dispatch_send_kernel(SendArgs a) {
  const BufferView& b = a.buffer;
  const TokensView& in = a.tokens;
  const int R = b.team.nranks, me = b.team.rank, E_local = b.experts_per_rank();
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int row_bytes = in.x_row_bytes;  // received rows are dense: [N][H] of x's dtype
  const int scale_cols = in.hidden / 128;
  __shared__ int32_t rows_of[kWarpsPerCta][kMaxRanks];
  int32_t* rows = rows_of[warp];

  if (*a.handle.status == 0) {
    for (int t = blockIdx.x * kWarpsPerCta + warp; t < in.num_tokens; t += gridDim.x * kWarpsPerCta) {
      for (int d = lane; d < R; d += kWarp) {
        const int32_t pos = a.handle.send_pos[t * R + d];
        rows[d] = pos < 0 ? -1 : a.handle.send_begin[d] + pos;
      }
      __syncwarp();
      copy_to_destinations(in.x + t * in.x_row_bytes_stride, in.x_row_bytes, b, rows, row_bytes, lane);
      for (int d = 0; d < R; ++d) {
        const int32_t row = rows[d];
        if (row < 0) continue;
        if (lane == 0) b.at<int32_t>(d, b.recv_src_idx)[row] = t;
        if (lane < in.topk) {
          const int64_t e = load_topk(in, t, lane);
          const bool here = e >= 0 && e / E_local == d;
          const int64_t local = here ? e - int64_t(d) * E_local : -1;
          if (in.topk_int64) {
            b.at<int64_t>(d, b.recv_topk_idx)[int64_t(row) * in.topk + lane] = local;
          } else {
            b.at<int32_t>(d, b.recv_topk_idx)[int64_t(row) * in.topk + lane] = int32_t(local);
          }
          const float w = in.weights != nullptr ? in.weights[t * in.weights_row_stride + lane] : 0.0f;
          b.at<float>(d, b.recv_topk_weights)[int64_t(row) * in.topk + lane] = here ? w : 0.0f;
        }
        if (in.scales != nullptr) {
          float* dst = b.at<float>(d, b.recv_scales) + int64_t(row) * scale_cols;
          for (int j = lane; j < scale_cols; j += kWarp) {
            dst[j] = in.scales[t * in.scale_row_stride + j * in.scale_col_stride];
          }
        }
      }
      __syncwarp();  // rows[] is rewritten for the next token
    }
  }

  __shared__ bool last;
  __shared__ uint64_t seq;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    last = atomicAdd(a.blocks_done, 1u) == gridDim.x - 1;
    seq = *(b.at<uint64_t>(me, b.sequence) + core::kDispatchNotify);
    if (last) {
      *a.blocks_done = 0;
      __threadfence_system();
      for (int d = 0; d < R; ++d) transport::add_release_sys(b.flag(d, core::kDispatchDone, me), 1);
    }
  }
  __syncthreads();
  if (!last) return;
  bool ok = true;
  for (int s = threadIdx.x; s < R; s += blockDim.x) {
    ok = ok && transport::wait_at_least(b.team, b.flag(me, core::kDispatchDone, s), seq,
                                        transport::WaitSite{transport::WaitPhase::ht_dispatch_done, s, 0});
  }
  if (!__syncthreads_and(ok) || !a.copy_src_idx) return;
  const int32_t num_recv = a.handle.recv_begin[R];
  const int32_t* src_idx = b.at<int32_t>(me, b.recv_src_idx);
  for (int i = threadIdx.x; i < num_recv; i += blockDim.x) a.handle.recv_src_idx[i] = src_idx[i];
}

}  // namespace

void launch_dispatch_send(const SendArgs& args, int num_blocks, cudaStream_t stream) {
  dispatch_send_kernel<<<num_blocks, kThreads, 0, stream>>>(args);
  detail::check_launch("ht dispatch_send_kernel");
}

}  // namespace epx::kernels::ht
