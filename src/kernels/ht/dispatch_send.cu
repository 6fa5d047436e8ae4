// HT dispatch, step 2: every row goes straight to its final place in each receiver's receive area.
//
// Work split: warp w of the grid takes tokens w, w + warps, ... . Its lane 0 drives the bulk copy
// engine through kStages shared-memory row buffers: it loads token i + 1's row while token i's row is
// stored to every destination rank d that needs it (row send_begin[d] + send_pos[t][d]): one read of
// x per token, one bulk store per destination, no registers spent on payload. The other lanes write
// the row's metadata with plain stores: src_idx, topk_idx rewritten to d's local expert ids (-1
// elsewhere), weights (0 where -1) and, for FP8, the row's scales.
//
// Protocol:
//   * Before this kernel, notify made sure every destination is in this dispatch (so its receive area
//     is free) and computed the rows.
//   * Each warp's lane 0 waits until its bulk stores are performed (bulk_wait_all), then each CTA:
//     __syncthreads; thread 0: system fence, one add to `blocks_done` (a private counter). The CTA that
//     brings it to gridDim.x is the last: it resets the counter and, after another system fence, adds
//     1 to flag[kDispatchDone][me] on every rank d (release). The fences chain every CTA's stores
//     before those releases.
//   * The last CTA then waits (acquire) until its own flag[kDispatchDone][s] >= seq for every source s:
//     when the kernel ends, every row of this dispatch has arrived here.
#include <algorithm>

#include "core/cuda_check.hpp"
#include "kernels/common/bulk_copy.cuh"
#include "kernels/ht/copy.cuh"
#include "kernels/ht/launch.hpp"
#include "kernels/ht/protocol.cuh"
#include "transport/device/wait.cuh"

namespace epx::kernels::ht {
namespace {

constexpr int kStages = 3;                        // row buffers per warp: one loading, one or two being stored
constexpr int kMaxWarps = 16;                     // per CTA; fewer when rows are large (shared memory)
constexpr std::size_t kStageBudget = 200 * 1024;  // shared memory for row buffers per CTA
constexpr int kMaxRanks = kMaxNvlinkRanks;

__global__ void __launch_bounds__(kMaxWarps* kWarp) dispatch_send_kernel(SendArgs a) {
  const BufferView& b = a.buffer;
  const TokensView& in = a.tokens;
  const int R = b.team.nranks, me = b.team.rank, E_local = b.experts_per_rank();
  const int warps = blockDim.x / kWarp, warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int row_bytes = in.x_row_bytes;  // received rows are dense: [N][H] of x's dtype
  const int scale_cols = in.hidden / 128;
  extern __shared__ __align__(128) uint8_t stage_memory[];  // [warps][kStages][row_bytes]
  __shared__ uint64_t loaded[kMaxWarps][kStages];           // mbarriers: a stage's row has arrived
  __shared__ int32_t rows_of[kMaxWarps][kMaxRanks];
  uint8_t* stages = stage_memory + std::size_t(warp) * kStages * row_bytes;
  int32_t* rows = rows_of[warp];
  // One thread reads the (host-mapped) status and the failure flag for the whole CTA: thousands of
  // threads each reading host memory at once cost tens of microseconds (measured: +34 us BF16).
  __shared__ bool go;
  if (threadIdx.x == 0) go = *a.handle.status == 0 && !team_failed(b.team);
  if (lane == 0) {
    for (int s = 0; s < kStages; ++s) mbarrier_init(&loaded[warp][s], 1);
  }
  __syncthreads();

  const int first = blockIdx.x * warps + warp, stride = gridDim.x * warps;
  const int count = first < in.num_tokens ? (in.num_tokens - first + stride - 1) / stride : 0;
  const auto row_of = [&](int i) { return in.x + int64_t(first + i * stride) * in.x_row_bytes_stride; };
  bool ok = go;
  if (ok && lane == 0 && count > 0) {
    mbarrier_expect_bytes(&loaded[warp][0], row_bytes);
    bulk_load(stages, row_of(0), row_bytes, &loaded[warp][0]);
  }
  for (int i = 0; ok && i < count; ++i) {
    const int t = first + i * stride, s = i % kStages;
    for (int d = lane; d < R; d += kWarp) {
      const int32_t pos = a.handle.send_pos[t * R + d];
      rows[d] = pos < 0 ? -1 : a.handle.send_begin[d] + pos;
    }
    __syncwarp();
    if (lane == 0) {
      if (i + 1 < count) {  // the stage of token i + 1 last held token i + 1 - kStages: its stores must have read it
        const int next = (i + 1) % kStages;
        bulk_wait_read<kStages - 2>();
        mbarrier_expect_bytes(&loaded[warp][next], row_bytes);
        bulk_load(stages + next * row_bytes, row_of(i + 1), row_bytes, &loaded[warp][next]);
      }
      ok = mbarrier_wait(b.team, &loaded[warp][s], (i / kStages) & 1,
                         transport::WaitSite{transport::WaitPhase::ht_bulk_load, me, uint32_t(t)});
      if (ok) {
        for (int d = 0; d < R; ++d) {
          if (rows[d] >= 0)
            bulk_store(b.at<uint8_t>(d, b.recv_x) + int64_t(rows[d]) * row_bytes, stages + s * row_bytes, row_bytes);
        }
        bulk_commit();
      }
    }
    ok = __shfl_sync(0xffffffffu, ok, 0);
    for (int d = 0; d < R; ++d) {
      const int32_t row = rows[d];
      if (row < 0) continue;
      if (lane == 0) b.at<int32_t>(d, b.recv_src_idx)[row] = t;
      if (lane < in.topk) {
        const int64_t e = topk_at(in.topk_idx, in.topk_int64, in.topk_row_stride, t, lane);
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
  if (lane == 0) bulk_wait_all();

  const uint64_t seq = *(b.at<uint64_t>(me, b.sequence) + core::kDispatchNotify);
  // A team that failed (a wait of this rank expired) signals nothing: its rows may be incomplete, and
  // the peers then time out themselves instead of taking them as a finished dispatch.
  if (!last_cta_signals(b, core::kDispatchDone, a.blocks_done, [] {})) return;
  wait_for_every_rank(b, core::kDispatchDone, seq, transport::WaitPhase::ht_dispatch_done);
}

}  // namespace

static_assert(std::size_t(kStages) * 2 * kMaxHidden <= kStageBudget, "a BF16 row of kMaxHidden must fit the stages");

void prepare_kernels() {
  detail::allow_dynamic_shared_memory(reinterpret_cast<const void*>(dispatch_send_kernel), int(kStageBudget),
                                      "cudaFuncSetAttribute(dispatch_send_kernel)");
  load_layout_kernel();
  load_notify_kernel();
  load_combine_kernel();
}

void launch_dispatch_send(const SendArgs& args, int num_blocks, cudaStream_t stream) {
  const std::size_t per_warp = std::size_t(kStages) * args.tokens.x_row_bytes;
  const int warps = int(std::max<std::size_t>(1, std::min<std::size_t>(kMaxWarps, kStageBudget / per_warp)));
  dispatch_send_kernel<<<num_blocks, warps * kWarp, warps * per_warp, stream>>>(args);
  detail::check_launch("ht dispatch_send_kernel");
}

}  // namespace epx::kernels::ht
