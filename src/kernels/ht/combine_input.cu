// HT combine, the copy of y: the rows of y that other ranks read must be in this rank's combine input
// (symmetric memory); this rank's own rows, read only here, stay in the caller's y. Rows of source s
// are [recv_begin[s], recv_begin[s + 1]) (the dispatch's handle). The kernel runs right before the
// combine kernel, which it lets start at once (programmatic dependent launch), so home ranks pull rows
// while the rest are copied.
//
// Protocol (the progress words of core::HtAreas, values stamped(call, groups)):
//   * Rows of home rank s's block (s != me) go in groups of kCombineCopyRows, a row per warp. CTA
//     (h, l) of the grid (h: the h-th home rank other than me, l < kCombineCopyCtas) copies groups
//     l, l + kCombineCopyCtas, ... of that block, in that order.
//   * Every CTA reads seq = sequence[kCombineDone] + 1, then allows the combine kernel behind it to
//     start (which stores seq only at its end): no CTA reads a later call's number. No CTA waits for
//     anything, so this kernel ends whether or not the combine kernel runs beside it.
//   * After each group: __syncthreads (every warp's stores of the group), then thread 0 sets
//     progress(s, me, l) = (seq, groups done so far) in s's memory with a system-scope release, which
//     the barrier makes cover every warp's stores. The combine kernel on s reads rows only below what
//     these words promise.
#include "core/cuda_check.hpp"
#include "kernels/common/grid.cuh"
#include "kernels/ht/copy.cuh"
#include "kernels/ht/launch.hpp"
#include "transport/device/phase_trace.hpp"

namespace epx::kernels::ht {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / kWarp;
static_assert(kWarps == core::kCombineCopyRows, "a row of a group per warp");
constexpr int kUnroll = 14;  // 16-byte vectors each lane loads before it stores (a 7168-wide row in two rounds)

// The whole warp copies row `row` of y (copy_y) and of the weights (copy_weights) into the combine input.
__device__ void copy_row(const CombineArgs& a, int64_t row, bool copy_y, bool copy_weights) {
  const BufferView& b = a.buffer;
  const int lane = threadIdx.x % kWarp, me = b.team.rank;
  if (copy_y) {
    const int vectors = a.hidden / 8;  // 8 bf16 per 16-byte vector
    const int4* src = reinterpret_cast<const int4*>(a.y + row * a.y_row_stride);
    int4* dst = b.at<int4>(me, b.combine_input) + row * vectors;
    for (int base = 0; base < vectors; base += kWarp * kUnroll) {
      int4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int j = base + u * kWarp + lane;
        if (j < vectors) v[u] = load_stream(src + j);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int j = base + u * kWarp + lane;
        if (j < vectors) dst[j] = v[u];
      }
    }
  }
  if (copy_weights && lane < a.topk) {
    b.at<float>(me, b.combine_input_weights)[row * a.topk + lane] = a.weights[row * a.weights_row_stride + lane];
  }
}

__global__ void __launch_bounds__(kThreads) stage_combine_input_kernel(CombineArgs a, bool copy_y, bool copy_weights) {
  const BufferView& b = a.buffer;
  const int R = b.team.nranks, me = b.team.rank;
  const int h = int(blockIdx.x) / core::kCombineCopyCtas, l = int(blockIdx.x) % core::kCombineCopyCtas;
  const int s = h < me ? h : h + 1;  // the home rank
  if (threadIdx.x % kWarp == 0) transport::trace<transport::TracePoint::ht_copy_start>(b.team);
  const uint64_t seq = b.at<uint64_t>(me, b.sequence)[core::kCombineDone] + 1;
  allow_dependent_launch();  // the combine kernel may start now (seq is read: see the protocol)
  // s's block, bounded by the rows of y whatever the handle holds.
  const int64_t n = min(int64_t(a.handle.recv_begin[R]), a.num_rows);
  const int64_t first = min(int64_t(a.handle.recv_begin[s]), n), end = min(int64_t(a.handle.recv_begin[s + 1]), n);
  uint32_t done = 0;
  for (int64_t g = l; first + g * core::kCombineCopyRows < end; g += core::kCombineCopyCtas) {
    const int64_t row = first + g * core::kCombineCopyRows + threadIdx.x / kWarp;
    if (row < end) copy_row(a, row, copy_y, copy_weights);
    __syncthreads();  // every warp's stores of the group, before its signal
    if (threadIdx.x == 0) {
      transport::store_release_sys(b.combine_progress_of(s, me, l), core::stamped(seq, ++done));
      if (done == 1) transport::trace<transport::TracePoint::ht_copy_first_group>(b.team);
    }
  }
  if (threadIdx.x == 0) transport::trace<transport::TracePoint::ht_copy_end>(b.team);
}

}  // namespace

void launch_stage_combine_input(const CombineArgs& args, bool copy_y, bool copy_weights, cudaStream_t stream) {
  const unsigned blocks = unsigned(core::kCombineCopyCtas * (args.buffer.team.nranks - 1));
  stage_combine_input_kernel<<<blocks, kThreads, 0, stream>>>(args, copy_y, copy_weights);
  detail::check_launch("ht stage_combine_input_kernel");
}

void load_stage_combine_input_kernel() {
  detail::load_kernel(reinterpret_cast<const void*>(stage_combine_input_kernel), "HT combine input kernel");
}

}  // namespace epx::kernels::ht
