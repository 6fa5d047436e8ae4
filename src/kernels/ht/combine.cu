// HT combine, pull form: each home rank reads, for each of its tokens, the rows that the ranks which
// received the token hold in their combine input (over NVLink; its own rows locally), and reduces them
// in one pass: out[t] = bf16(sum over r ascending with send_pos[t][r] >= 0 of float(row of t on r),
// then + float(bias[t])), plain float adds in that order (bit-equal to the reference); the weights
// likewise. Rank r's row of token t is send_begin[r] + send_pos[t][r] (the dispatch's layout).
//
// Data path: each warp takes tokens w, w + warps, ... and walks each row in chunks. Its lane 0 has the
// bulk copy engine load, for a chunk, the slice of every present rank's row into one shared-memory
// stage ([R][chunk], one mbarrier per stage), two chunks ahead of the one the warp reduces; the lanes
// then add the slices in rank order, add the bias and store the output. Many bytes are in flight per
// SM without registers, which is what remote (NVLink) reads need.
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

#include <algorithm>

#include "core/cuda_check.hpp"
#include "kernels/common/bulk_copy.cuh"
#include "kernels/ht/copy.cuh"
#include "kernels/ht/launch.hpp"
#include "transport/device/wait.cuh"

namespace epx::kernels::ht {
namespace {

constexpr int kWarps = 8;                         // per CTA
constexpr int kStages = 3;                        // chunks per warp: two loading while one is reduced
constexpr std::size_t kStageBudget = 192 * 1024;  // shared memory for stages per CTA

__device__ bool wait_all(const BufferView& b, int kind, uint64_t seq, transport::WaitPhase phase) {
  bool ok = true;
  for (int r = threadIdx.x; r < b.team.nranks; r += blockDim.x) {
    ok = ok && transport::wait_at_least(b.team, b.flag(b.team.rank, kind, r), seq, transport::WaitSite{phase, r, 0});
  }
  return __syncthreads_and(ok);
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

// One warp's sequence of (token, chunk) items.
struct WarpItems {
  int first, stride, count, chunks, chunk_bytes, row_bytes;
  __device__ int token(int i) const { return first + (i / chunks) * stride; }
  __device__ int offset(int i) const { return (i % chunks) * chunk_bytes; }
  __device__ int bytes(int i) const { return min(chunk_bytes, row_bytes - offset(i)); }
};

// Lane 0: loads item i's slice of every present rank's row into `stage` (slot r at r * chunk_bytes).
__device__ void load_item(const CombineArgs& a, const WarpItems& w, int i, uint8_t* stage, uint64_t* bar) {
  const BufferView& b = a.buffer;
  const int R = b.team.nranks, t = w.token(i), offset = w.offset(i), bytes = w.bytes(i);
  const int32_t* pos = a.handle.send_pos + int64_t(t) * R;
  int present = 0;
  for (int r = 0; r < R; ++r) present += pos[r] >= 0;
  fence_async_shared();  // the lanes' reads of this stage's previous chunk come first
  mbarrier_expect_bytes(bar, uint32_t(present * bytes));
  for (int r = 0; r < R; ++r) {
    if (pos[r] < 0) continue;
    const int64_t row = a.handle.send_begin[r] + pos[r];
    bulk_load(stage + r * w.chunk_bytes, b.at<uint8_t>(r, b.combine_input) + row * w.row_bytes + offset, bytes, bar);
  }
}

__global__ void __launch_bounds__(kWarps* kWarp) combine_pull_kernel(CombineArgs a, int chunk_bytes) {
  const BufferView& b = a.buffer;
  const int R = b.team.nranks, me = b.team.rank;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  uint64_t* sequence = b.at<uint64_t>(me, b.sequence) + core::kCombineReady;
  const uint64_t seq = *sequence + 1;
  if (blockIdx.x == 0) {
    for (int r = threadIdx.x; r < R; r += blockDim.x) transport::add_release_sys(b.flag(r, core::kCombineReady, me), 1);
  }
  bool ok = wait_all(b, core::kCombineReady, seq, transport::WaitPhase::ht_combine_ready);

  extern __shared__ __align__(128) uint8_t stage_memory[];  // [kWarps][kStages][R][chunk_bytes]
  __shared__ uint64_t loaded[kWarps][kStages];
  const std::size_t stage_bytes = std::size_t(R) * chunk_bytes;
  uint8_t* stages = stage_memory + std::size_t(warp) * kStages * stage_bytes;
  if (lane == 0) {
    for (int s = 0; s < kStages; ++s) mbarrier_init(&loaded[warp][s], 1);
  }
  __syncwarp();

  WarpItems w;
  w.first = blockIdx.x * kWarps + warp;
  w.stride = gridDim.x * kWarps;
  w.row_bytes = 2 * a.hidden;
  w.chunk_bytes = chunk_bytes;
  w.chunks = (w.row_bytes + chunk_bytes - 1) / chunk_bytes;
  w.count = w.first < a.num_tokens ? (a.num_tokens - w.first + w.stride - 1) / w.stride * w.chunks : 0;
  if (ok && lane == 0) {
    for (int i = 0; i < kStages - 1 && i < w.count; ++i) load_item(a, w, i, stages + i * stage_bytes, &loaded[warp][i]);
  }
  for (int i = 0; ok && i < w.count; ++i) {
    const int s = i % kStages, t = w.token(i), offset = w.offset(i);
    if (lane == 0) {
      const int ahead = i + kStages - 1;  // its stage last held item i - 1, reduced in the previous round
      if (ahead < w.count)
        load_item(a, w, ahead, stages + (ahead % kStages) * stage_bytes, &loaded[warp][ahead % kStages]);
      ok = mbarrier_wait(b.team, &loaded[warp][s], (i / kStages) & 1,
                         transport::WaitSite{transport::WaitPhase::ht_bulk_load, me, uint32_t(t)});
    }
    ok = __shfl_sync(0xffffffffu, ok, 0);
    if (!ok) break;
    const int32_t* pos = a.handle.send_pos + int64_t(t) * R;
    const uint8_t* stage = stages + s * stage_bytes;
    const int vectors = w.bytes(i) / 16;
    for (int j = lane; j < vectors; j += kWarp) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int r = 0; r < R; ++r) {
        if (pos[r] >= 0) accumulate(acc, reinterpret_cast<const int4*>(stage + r * chunk_bytes)[j]);
      }
      const int64_t column = offset / 16 + j;
      if (a.bias != nullptr) {
        accumulate(acc, load_stream(reinterpret_cast<const int4*>(a.bias + int64_t(t) * a.bias_row_stride) + column));
      }
      int4 packed;
      __nv_bfloat162* p = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
      for (int q = 0; q < 4; ++q) p[q] = __floats2bfloat162_rn(acc[2 * q], acc[2 * q + 1]);
      reinterpret_cast<int4*>(a.out + int64_t(t) * a.hidden)[column] = packed;
    }
    if (offset == 0 && a.out_weights != nullptr && lane < a.topk) {
      float sum = 0.0f;
      for (int r = 0; r < R; ++r) {
        if (pos[r] < 0) continue;
        const int64_t row = a.handle.send_begin[r] + pos[r];
        sum = sum + b.at<float>(r, b.combine_input_weights)[row * a.topk + lane];
      }
      a.out_weights[int64_t(t) * a.topk + lane] = sum;
    }
    __syncwarp();  // every lane is done with stage s before lane 0 reloads it
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
      for (int r = 0; r < R; ++r) transport::add_release_sys(b.flag(r, core::kCombineDone, me), 1);
    }
  }
  __syncthreads();
  if (last) wait_all(b, core::kCombineDone, seq, transport::WaitPhase::ht_combine_done);
}

}  // namespace

void launch_combine(const CombineArgs& args, int num_blocks, cudaStream_t stream) {
  static const cudaError_t raised =
      cudaFuncSetAttribute(combine_pull_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kStageBudget));
  detail::check_cuda(raised, "cudaFuncSetAttribute(combine_pull_kernel)");
  // A chunk: the largest multiple of 256 bytes (at most a row) whose R slices fit the stages.
  const int R = args.buffer.team.nranks, row_bytes = 2 * args.hidden;
  const std::size_t per_slice = kStageBudget / (std::size_t(kWarps) * kStages * R);
  const int chunk_bytes = int(std::min<std::size_t>(row_bytes, std::max<std::size_t>(256, per_slice / 256 * 256)));
  const std::size_t smem = std::size_t(kWarps) * kStages * R * chunk_bytes;
  combine_pull_kernel<<<num_blocks, kWarps * kWarp, smem, stream>>>(args, chunk_bytes);
  detail::check_launch("ht combine_pull_kernel");
}

}  // namespace epx::kernels::ht
