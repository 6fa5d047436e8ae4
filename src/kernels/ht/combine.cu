// HT combine: every expert-side rank pushes each received row's y back to the row's home rank, which
// then reduces. Two kernels.
//
// combine_push (num_sms CTAs):
//   * Every CTA computes seq = sequence[kCombineReady] + 1; the last CTA to finish stores it, after all
//     CTAs have read the old value.
//   * CTA 0 adds 1 to flag[kCombineReady][me] on every rank h: "my landing area is free" (this kernel
//     runs after my previous combine's reduce on my stream).
//   * Every CTA waits (acquire) until its own flag[kCombineReady][h] >= seq for every h, then its
//     warps take received rows i = w, w + warps, ...: source h, token t = recv_src_idx[i]; rows from
//     this rank itself are not moved (the reduce reads them in place); the others go to
//     h's combine_y[t][me] (and weights to combine_weights[t][me]).
//   * Completion as in dispatch_send: fences, a private CTA counter, and the last CTA adds 1 to
//     flag[kCombineDone][me] on every rank (release).
// combine_reduce (num_sms CTAs): every CTA waits (acquire) until flag[kCombineDone][r] >= seq for
//   every r, then warps take tokens t: out[t] = bf16(sum over r ascending with send_pos[t][r] >= 0 of
//   float(row of t from r) + float(bias[t])), plain float adds in that order (bit-equal to the
//   reference), and the weights likewise.
#include <cuda_bf16.h>

#include "core/cuda_check.hpp"
#include "kernels/ht/copy.cuh"
#include "kernels/ht/launch.hpp"
#include "transport/device/wait.cuh"

namespace epx::kernels::ht {
namespace {

constexpr int kThreads = 1024;  // 32 warps: more rows in flight per SM
constexpr int kWarpsPerCta = kThreads / kWarp;
constexpr int kReduceUnroll = 2;  // vectors per lane in flight per rank (more spills at 64 registers)

__device__ bool wait_all(const BufferView& b, int kind, uint64_t seq, transport::WaitPhase phase) {
  bool ok = true;
  for (int r = threadIdx.x; r < b.team.nranks; r += blockDim.x) {
    ok = ok && transport::wait_at_least(b.team, b.flag(b.team.rank, kind, r), seq, transport::WaitSite{phase, r, 0});
  }
  return __syncthreads_and(ok);
}

__global__ void __launch_bounds__(kThreads) combine_push_kernel(CombineArgs a) {
  const BufferView& b = a.buffer;
  const int R = b.team.nranks, me = b.team.rank;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  uint64_t* sequence = b.at<uint64_t>(me, b.sequence) + core::kCombineReady;
  const uint64_t seq = *sequence + 1;
  if (blockIdx.x == 0) {
    for (int h = threadIdx.x; h < R; h += blockDim.x) transport::add_release_sys(b.flag(h, core::kCombineReady, me), 1);
  }
  if (!wait_all(b, core::kCombineReady, seq, transport::WaitPhase::ht_combine_ready)) return;

  const int row_bytes = 2 * a.hidden;
  const int num_recv = a.handle.recv_begin[R];
  for (int i = blockIdx.x * kWarpsPerCta + warp; i < num_recv; i += gridDim.x * kWarpsPerCta) {
    int h = 0;
    while (i >= a.handle.recv_begin[h + 1]) ++h;
    if (h == me) continue;
    const int t = a.handle.recv_src_idx[i];
    const int4* src = reinterpret_cast<const int4*>(a.y + int64_t(i) * a.y_row_stride);
    int4* dst = reinterpret_cast<int4*>(b.at<uint8_t>(h, b.combine_y) + (int64_t(t) * R + me) * row_bytes);
    const int n = row_bytes / 16;
    for (int base = 0; base < n; base += kWarp * kCopyUnroll) {
      int4 v[kCopyUnroll];
#pragma unroll
      for (int u = 0; u < kCopyUnroll; ++u) {
        const int j = base + u * kWarp + lane;
        if (j < n) v[u] = load_stream(src + j);
      }
#pragma unroll
      for (int u = 0; u < kCopyUnroll; ++u) {
        const int j = base + u * kWarp + lane;
        if (j < n) dst[j] = v[u];
      }
    }
    if (a.weights != nullptr && lane < a.topk) {
      b.at<float>(h, b.combine_weights)[(int64_t(t) * R + me) * a.topk + lane] =
          a.weights[int64_t(i) * a.weights_row_stride + lane];
    }
  }

  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    last = atomicAdd(a.blocks_done, 1u) == gridDim.x - 1;
    if (last) {
      *a.blocks_done = 0;
      *sequence = seq;
      __threadfence_system();
      for (int h = 0; h < R; ++h) transport::add_release_sys(b.flag(h, core::kCombineDone, me), 1);
    }
  }
}

__device__ void accumulate(float (&acc)[8], const int4& v) {
  const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __bfloat1622float2(p[j]);
    acc[2 * j] = acc[2 * j] + f.x;
    acc[2 * j + 1] = acc[2 * j + 1] + f.y;
  }
}

__global__ void __launch_bounds__(kThreads) combine_reduce_kernel(CombineArgs a) {
  const BufferView& b = a.buffer;
  const int R = b.team.nranks, me = b.team.rank;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const uint64_t seq = *(b.at<uint64_t>(me, b.sequence) + core::kCombineReady);
  if (!wait_all(b, core::kCombineDone, seq, transport::WaitPhase::ht_combine_done)) return;

  const int row_bytes = 2 * a.hidden;
  const int vectors = row_bytes / 16;  // 8 bf16 per 16-byte vector
  const uint8_t* landing = b.at<uint8_t>(me, b.combine_y);
  for (int t = blockIdx.x * kWarpsPerCta + warp; t < a.num_tokens; t += gridDim.x * kWarpsPerCta) {
    const int32_t* pos = a.handle.send_pos + int64_t(t) * R;
    // Each lane owns kReduceUnroll vectors at a time; per rank they are loaded together before they are
    // added, so kReduceUnroll loads are in flight (ranks stay in ascending order).
    for (int base = 0; base < vectors; base += kWarp * kReduceUnroll) {
      float acc[kReduceUnroll][8] = {};
      for (int r = 0; r < R; ++r) {
        if (pos[r] < 0) continue;
        const int4* row = r == me ? reinterpret_cast<const int4*>(a.y + int64_t(a.handle.send_begin[me] + pos[r]) *
                                                                            a.y_row_stride)
                                  : reinterpret_cast<const int4*>(landing + (int64_t(t) * R + r) * row_bytes);
        int4 v[kReduceUnroll];
#pragma unroll
        for (int u = 0; u < kReduceUnroll; ++u) {
          const int j = base + u * kWarp + lane;
          if (j < vectors) v[u] = load_stream(row + j);
        }
#pragma unroll
        for (int u = 0; u < kReduceUnroll; ++u) {
          if (base + u * kWarp + lane < vectors) accumulate(acc[u], v[u]);
        }
      }
#pragma unroll
      for (int u = 0; u < kReduceUnroll; ++u) {
        const int j = base + u * kWarp + lane;
        if (j >= vectors) continue;
        if (a.bias != nullptr) {
          accumulate(acc[u], load_stream(reinterpret_cast<const int4*>(a.bias + int64_t(t) * a.bias_row_stride) + j));
        }
        int4 packed;
        __nv_bfloat162* p = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
        for (int q = 0; q < 4; ++q) p[q] = __floats2bfloat162_rn(acc[u][2 * q], acc[u][2 * q + 1]);
        reinterpret_cast<int4*>(a.out + int64_t(t) * a.hidden)[j] = packed;
      }
    }
    if (a.out_weights != nullptr && lane < a.topk) {
      float w = 0.0f;
      for (int r = 0; r < R; ++r) {
        if (pos[r] < 0) continue;
        w = w + (r == me ? a.weights[int64_t(a.handle.send_begin[me] + pos[r]) * a.weights_row_stride + lane]
                         : b.at<float>(me, b.combine_weights)[(int64_t(t) * R + r) * a.topk + lane]);
      }
      a.out_weights[int64_t(t) * a.topk + lane] = w;
    }
  }
}

}  // namespace

void launch_combine(const CombineArgs& args, int num_blocks, cudaStream_t stream) {
  combine_push_kernel<<<num_blocks, kThreads, 0, stream>>>(args);
  detail::check_launch("ht combine_push_kernel");
  combine_reduce_kernel<<<num_blocks, kThreads, 0, stream>>>(args);
  detail::check_launch("ht combine_reduce_kernel");
}

}  // namespace epx::kernels::ht
