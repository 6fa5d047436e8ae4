// HT combine, pull form: each home rank reads, for each of its tokens, the rows that the ranks which
// received the token hold in their combine input (over NVLink; its own rows locally), and reduces them
// in one pass: out[t] = bf16(sum over r ascending with send_pos[t][r] >= 0 of float(row of t on r),
// then + float(bias[t])), plain float adds in that order (bit-equal to the reference); the weights
// likewise. Rank r's row of token t is send_begin[r] + send_pos[t][r] (the dispatch's layout).
//
// Protocol (flags of core::HtFlag):
//   * Every CTA computes seq = sequence[kCombineReady] + 1; the last CTA to finish stores it, after
//     all CTAs have read the old value.
//   * CTA 0 adds 1 to flag[kCombineReady][me] on every rank (release): "my combine input is complete"
//     (the caller wrote it, or the library copied it, earlier on this stream).
//   * Every CTA waits (acquire) until its own flag[kCombineReady][r] >= seq for every r, then reads.
//   * Completion: each CTA fences and adds to a private counter; the last one adds 1 to
//     flag[kCombineDone][me] on every rank ("I have finished reading your input"), then waits until
//     its own flag[kCombineDone][r] >= seq for every r. So when the kernel ends, nobody reads this
//     rank's combine input any more, and the caller may write the next one in stream order.
#include <cuda_bf16.h>

#include "core/cuda_check.hpp"
#include "kernels/ht/copy.cuh"
#include "kernels/ht/launch.hpp"
#include "kernels/ht/protocol.cuh"
#include "transport/device/wait.cuh"

namespace epx::kernels::ht {
namespace {

constexpr int kThreads = 1024;  // 32 warps: many remote loads in flight per SM
constexpr int kWarpsPerCta = kThreads / kWarp;
constexpr int kUnroll = 2;         // vectors per lane and rank loaded before they are added
constexpr int kRanksInFlight = 2;  // ranks whose loads are in flight together (64 registers)
constexpr int kMaxRanks = kMaxNvlinkRanks;

__device__ void accumulate(float (&acc)[8], const int4& v) {
  const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __bfloat1622float2(p[j]);
    acc[2 * j] = acc[2 * j] + f.x;
    acc[2 * j + 1] = acc[2 * j + 1] + f.y;
  }
}

__device__ int4 load_any(const int4* p) { return *p; }  // a remote row may be written by its owner: no .nc

__global__ void __launch_bounds__(kThreads) combine_pull_kernel(CombineArgs a) {
  const BufferView& b = a.buffer;
  const int R = b.team.nranks, me = b.team.rank;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  uint64_t* sequence = b.at<uint64_t>(me, b.sequence) + core::kCombineReady;
  const uint64_t seq = *sequence + 1;
  if (blockIdx.x == 0) {
    for (int r = threadIdx.x; r < R; r += blockDim.x) transport::add_release_sys(b.flag(r, core::kCombineReady, me), 1);
  }
  const bool ready = wait_for_every_rank(b, core::kCombineReady, seq, transport::WaitPhase::ht_combine_ready);

  __shared__ int32_t rows_of[kWarpsPerCta][kMaxRanks];
  int32_t* rows = rows_of[warp];
  const int row_bytes = 2 * a.hidden;
  const int vectors = row_bytes / 16;  // 8 bf16 per 16-byte vector
  for (int t = blockIdx.x * kWarpsPerCta + warp; ready && t < a.num_tokens; t += gridDim.x * kWarpsPerCta) {
    for (int r = lane; r < R; r += kWarp) {
      const int32_t pos = a.handle.send_pos[int64_t(t) * R + r];
      rows[r] = pos < 0 ? -1 : a.handle.send_begin[r] + pos;
    }
    __syncwarp();
    for (int base = 0; base < vectors; base += kWarp * kUnroll) {
      float acc[kUnroll][8] = {};
      // Ranks in groups of kRanksInFlight: every load of a group is issued before the first is added
      // (a local row and a remote one wait together), then they are added in ascending rank order.
      for (int group = 0; group < R; group += kRanksInFlight) {
        int4 v[kRanksInFlight][kUnroll];
#pragma unroll
        for (int g = 0; g < kRanksInFlight; ++g) {
          const int r = group + g;
          if (r >= R || rows[r] < 0) continue;
          const int4* row =
              reinterpret_cast<const int4*>(b.at<uint8_t>(r, b.combine_input) + int64_t(rows[r]) * row_bytes);
#pragma unroll
          for (int u = 0; u < kUnroll; ++u) {
            const int j = base + u * kWarp + lane;
            if (j < vectors) v[g][u] = load_any(row + j);
          }
        }
#pragma unroll
        for (int g = 0; g < kRanksInFlight; ++g) {
          const int r = group + g;
          if (r >= R || rows[r] < 0) continue;
#pragma unroll
          for (int u = 0; u < kUnroll; ++u) {
            if (base + u * kWarp + lane < vectors) accumulate(acc[u], v[g][u]);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
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
        if (rows[r] >= 0) w = w + b.at<float>(r, b.combine_input_weights)[int64_t(rows[r]) * a.topk + lane];
      }
      a.out_weights[int64_t(t) * a.topk + lane] = w;
    }
    __syncwarp();  // rows[] is rewritten for the next token
  }

  if (last_cta_signals(b, core::kCombineDone, a.blocks_done, [&] { *sequence = seq; })) {
    wait_for_every_rank(b, core::kCombineDone, seq, transport::WaitPhase::ht_combine_done);
  }
}

}  // namespace

void launch_combine(const CombineArgs& args, int num_blocks, cudaStream_t stream) {
  combine_pull_kernel<<<num_blocks, kThreads, 0, stream>>>(args);
  detail::check_launch("ht combine_pull_kernel");
}

void load_combine_kernel() {
  detail::load_kernel(reinterpret_cast<const void*>(combine_pull_kernel), "HT combine kernel");
}

}  // namespace epx::kernels::ht
