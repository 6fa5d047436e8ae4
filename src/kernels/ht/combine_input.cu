// HT combine, before the pull: the rows of y that other ranks read must be in this rank's combine
// input (symmetric memory); this rank's own rows, read only here, stay in the caller's y. Rows of
// source s are [recv_begin[s], recv_begin[s + 1]) (the dispatch's handle), so the rows to copy are
// [0, recv_begin[me]) and [recv_begin[me + 1], N). No protocol: the kernel precedes the combine kernel
// in stream order, which signals that the input is complete (combine.cu).
#include "core/cuda_check.hpp"
#include "kernels/common/grid.cuh"
#include "kernels/ht/copy.cuh"
#include "kernels/ht/launch.hpp"

namespace epx::kernels::ht {
namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 4;  // 16-byte vectors each lane loads before it stores

__global__ void __launch_bounds__(kThreads) stage_combine_input_kernel(CombineArgs a, bool copy_y, bool copy_weights) {
  const BufferView& b = a.buffer;
  const int R = b.team.nranks, me = b.team.rank, lane = threadIdx.x % kWarp;
  // Bounded by the rows of y, whatever the handle holds.
  const int64_t n = min(int64_t(a.handle.recv_begin[R]), a.num_rows);
  const int64_t own_first = min(int64_t(a.handle.recv_begin[me]), n);
  const int64_t own_rows = max(min(int64_t(a.handle.recv_begin[me + 1]), n) - own_first, int64_t(0));
  const int64_t shared_rows = n - own_rows;
  const int vectors = a.hidden / 8;  // 8 bf16 per 16-byte vector
  int4* input = b.at<int4>(me, b.combine_input);
  float* input_weights = b.at<float>(me, b.combine_input_weights);
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / kWarp);
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; i < shared_rows; i += warps) {
    const int64_t row = i < own_first ? i : i + own_rows;
    if (copy_y) {
      const int4* src = reinterpret_cast<const int4*>(a.y + row * a.y_row_stride);
      int4* dst = input + row * vectors;
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
      input_weights[row * a.topk + lane] = a.weights[row * a.weights_row_stride + lane];
    }
  }
}

}  // namespace

void launch_stage_combine_input(const CombineArgs& args, bool copy_y, bool copy_weights, int num_blocks,
                                cudaStream_t stream) {
  stage_combine_input_kernel<<<num_blocks, kThreads, 0, stream>>>(args, copy_y, copy_weights);
  detail::check_launch("ht stage_combine_input_kernel");
}

void load_stage_combine_input_kernel() {
  detail::load_kernel(reinterpret_cast<const void*>(stage_combine_input_kernel), "HT combine input kernel");
}

}  // namespace epx::kernels::ht
