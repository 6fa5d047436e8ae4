// HT dispatch: one kernel. CTA 0 announces this rank's counts (count_exchange.cuh); every CTA waits for
// every rank's, then sends its rows straight to their final place in each receiver's receive area.
//
// Work split: each warp of the grid starts with token (its index in the grid); then it claims the next
// unclaimed token from a private counter (tokens_claimed), so warps whose stores drain faster take more
// tokens. Its lane 0 drives the bulk copy engine through kStages shared-memory row buffers: it loads
// the next token's row while this token's row is stored to every destination rank d that needs it
// (row send_begin[d] + send_pos[t][d]): one read of x per token, one bulk store per destination, no
// registers spent on payload. All lanes load the next token's metadata into registers (TokenMeta) one
// row ahead, then write this token's with plain stores: src_idx, topk_idx rewritten to d's local
// expert ids (-1 elsewhere), weights (0 where -1) and, for FP8, the row's scales.
//
// Protocol:
//   * Every CTA's thread 0 reads seq = sequence[kDispatchDone] + 1 at the start; nothing writes the
//     sequence until the last CTA (below), which runs after every CTA has read it.
//   * CTA 0 announces this rank's counts (count_exchange.cuh, step 1). Meanwhile the other CTAs issue
//     their first row loads and metadata loads (which need no counts).
//   * Every CTA waits for every rank's counts (step 2: every destination is then in this dispatch, so
//     its receive area is free) and reads from the count matrix whether to send and where its rows
//     start (step 3). CTA 0 then also writes the handle and reports N to the host (steps 3 and 4);
//     nothing else waits for that.
//   * Worst-case form: once the counts are known, all CTAs together mark the padding rows
//     [N, num_worst) as "no token" (src_idx -1, topk_idx -1, weights 0; x is left as it is).
//   * Each warp's lane 0 waits until its bulk stores are performed (bulk_wait_all), then each CTA
//     signals kDispatchDone to every rank d on its own (signal_done, protocol.cuh: a CTA barrier, a
//     system fence, its done word in d's memory), and then counts itself in `blocks_done` (a private
//     counter). The CTA that counts itself last resets the counter and tokens_claimed (every warp made
//     its last claim before its CTA counted itself) and stores sequence = seq.
//   * That CTA then waits until every CTA of every source s has signalled (wait_for_every_cta): when the
//     kernel ends, every row of this dispatch has arrived here. (A source's next dispatch cannot signal
//     while this rank waits: each of its CTAs first waits for this rank's counts of that call.)
#include <algorithm>

#include "core/cuda_check.hpp"
#include "kernels/common/bulk_copy.cuh"
#include "kernels/common/launch.hpp"
#include "kernels/ht/copy.cuh"
#include "kernels/ht/count_exchange.cuh"
#include "kernels/ht/launch.hpp"
#include "kernels/ht/protocol.cuh"
#include "transport/device/phase_trace.hpp"
#include "transport/device/wait.cuh"

namespace epx::kernels::ht {
namespace {

constexpr int kStages = 3;                        // row buffers per warp: one loading, one or two being stored
constexpr int kMaxWarps = 16;                     // per CTA; fewer when rows are large (shared memory)
constexpr std::size_t kStageBudget = 200 * 1024;  // shared memory for row buffers per CTA
constexpr int kMaxRanks = kMaxNvlinkRanks;

// Worst-case form: padding rows [num_recv, num_worst) say "no token", spread over the whole grid.
__device__ void fill_padding_rows(const BufferView& b, int32_t num_recv, int64_t num_worst, int topk, bool topk_int64) {
  const int me = b.team.rank;
  int32_t* src_idx = b.at<int32_t>(me, b.recv_src_idx);
  float* weights = b.at<float>(me, b.recv_topk_weights);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = num_recv + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < num_worst; i += stride) {
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

constexpr int kScalesPerLane = kMaxHidden / 128 / kWarp;
constexpr int kRanksPerLane = (kMaxRanks + kWarp - 1) / kWarp;

// What one lane holds of a token's row metadata. Loaded one token ahead of its use, so the loads'
// latency hides behind the row before: lane k < K its k-th expert id and weight, its share of the FP8
// scales (columns lane, lane + 32, ...) and of the token's positions per rank (ranks lane, lane + 32, ...).
struct TokenMeta {
  int64_t expert;
  float weight;
  float scales[kScalesPerLane];
  int32_t pos[kRanksPerLane];
};

// The caller's inputs: readable from the kernel's start.
__device__ void load_inputs(TokenMeta& m, const TokensView& in, int t, int lane) {
  m.expert = lane < in.topk ? topk_at(in.topk_idx, in.topk_int64, in.topk_row_stride, t, lane) : -1;
  m.weight = lane < in.topk && in.weights != nullptr ? in.weights[t * in.weights_row_stride + lane] : 0.0f;
  const int scale_cols = in.scale_cols();
#pragma unroll
  for (int q = 0; q < kScalesPerLane; ++q) {
    const int j = lane + q * kWarp;
    m.scales[q] = j < scale_cols ? in.scales[t * in.scale_row_stride + j * in.scale_col_stride] : 0.0f;
  }
}

// The layout's send positions: readable after wait_for_prior_grid.
__device__ void load_positions(TokenMeta& m, const HandleView& h, int t, int R, int lane) {
#pragma unroll
  for (int q = 0; q < kRanksPerLane; ++q) {
    const int d = lane + q * kWarp;
    m.pos[q] = d < R ? h.send_pos[t * R + d] : -1;
  }
}

__global__ void __launch_bounds__(kMaxWarps* kWarp) dispatch_kernel(DispatchArgs a) {
  const BufferView& b = a.buffer;
  const TokensView& in = a.tokens;
  const int R = b.team.nranks, me = b.team.rank, E_local = b.experts_per_rank();
  const int warps = blockDim.x / kWarp, warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int row_bytes = in.x_row_bytes;  // received rows are dense: [N][H] of x's dtype
  const int scale_cols = in.scale_cols();
  extern __shared__ __align__(128) uint8_t stage_memory[];  // [warps][kStages][row_bytes]
  __shared__ uint64_t loaded[kMaxWarps][kStages];           // mbarriers: a stage's row has arrived
  __shared__ int32_t rows_of[kMaxWarps][kMaxRanks];
  __shared__ uint64_t seq;
  __shared__ bool go;           // every rank's counts are in, and no input failed
  __shared__ int32_t num_recv;  // N (worst-case form only)
  uint8_t* stages = stage_memory + std::size_t(warp) * kStages * row_bytes;
  int32_t* rows = rows_of[warp];
  uint64_t* sequence = b.at<uint64_t>(me, b.sequence) + core::kDispatchDone;
  if (threadIdx.x % kWarp == 0) transport::trace<transport::TracePoint::ht_dispatch_start>(b.team);
  if (threadIdx.x == 0) {
    seq = *sequence + 1;
    go = false;
  }
  if (lane == 0) {
    for (int s = 0; s < kStages; ++s) mbarrier_init(&loaded[warp][s], 1);
  }
  __syncthreads();

  // Each warp's first token is static (its load overlaps the count exchange); after that, a warp claims
  // the next unclaimed token (stride + a.tokens_claimed++), one claim ahead so that the atomic's
  // latency hides behind a row. Claims balance warps whose stores drain at different speeds.
  const int T = in.num_tokens, stride = gridDim.x * warps;
  const auto claim = [&] { return stride + int(atomicAdd(a.tokens_claimed, 1u)); };
  const auto row_of = [&](int t) { return in.x + int64_t(t) * in.x_row_bytes_stride; };
  int t = blockIdx.x * warps + warp;  // this warp's token
  int t_next = T;                     // lane 0 only: the token after it (claimed, its row loading)
  TokenMeta meta{}, meta_next{};      // t's, and t_next's once the loop has loaded it
  if (t < T) {                        // the first row and its inputs need no counts: their loads overlap the exchange
    load_inputs(meta, in, t, lane);
    if (lane == 0) {
      mbarrier_expect_bytes(&loaded[warp][0], row_bytes);
      bulk_load(stages, row_of(t), row_bytes, &loaded[warp][0]);
      t_next = claim();
    }
  }
  wait_for_prior_grid();  // the layout kernel's outputs (launch_dispatch: after_layout)
  if (threadIdx.x == 0) transport::trace<transport::TracePoint::ht_dispatch_layout_done>(b.team);
  if (t < T) load_positions(meta, a.handle, t, R, lane);
  const bool cached = a.counts.cached;
  if (blockIdx.x == 0) announce_counts(a, seq);
  // Every CTA waits for every rank's counts itself (no CTA waits for another before sending).
  const bool heard = wait_for_counts(b, seq, cached, blockIdx.x == 0);
  if (blockIdx.x == 0 && threadIdx.x == 0) transport::trace<transport::TracePoint::ht_dispatch_counts_cta0>(b.team);
  if (blockIdx.x == 0) {
    if (!heard) {
      if (threadIdx.x == 0) *a.handle.status = kStatusTeamFailed;  // the host reports the expired wait
    } else {
      if (!cached) count_exchange_results(a);
      __syncthreads();
      report_counts_to_host(a);
      if (threadIdx.x == 0) transport::trace<transport::TracePoint::ht_dispatch_reported>(b.team);
    }
  }
  // One thread reads the status and the failure flag for the whole CTA: thousands of threads each
  // reading the failure word at once cost tens of microseconds (measured: +34 us BF16).
  if (threadIdx.x == 0 && heard) {
    const int failed = cached ? -1 : failed_source(b);
    go = failed < 0 && (!cached || *a.handle.status == 0) && !team_failed(b.team);
    if (a.counts.num_worst_tokens > 0) {
      num_recv = cached ? a.handle.recv_begin[R] : failed < 0 ? rows_from_every_source(b) : 0;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) transport::trace<transport::TracePoint::ht_dispatch_counts>(b.team);
  if (heard && a.counts.num_worst_tokens > 0)
    fill_padding_rows(b, num_recv, a.counts.num_worst_tokens, in.topk, in.topk_int64);
  int32_t begin[kRanksPerLane];  // where this rank's rows start on ranks lane, lane + 32, ...
#pragma unroll
  for (int q = 0; q < kRanksPerLane; ++q) {
    const int d = lane + q * kWarp;
    begin[q] = !go || d >= R ? 0 : cached ? a.handle.send_begin[d] : rows_before(b, d);
  }

  bool ok = go;
  if (!ok && lane == 0 && t < T) {  // no sending: the first load must still land before the CTA exits
    mbarrier_wait(b.team, &loaded[warp][0], 0,
                  transport::WaitSite{transport::WaitPhase::ht_bulk_load, me, uint32_t(t)});
  }
  for (int i = 0; ok && t < T; ++i) {
    const int s = i % kStages;
#pragma unroll
    for (int q = 0; q < kRanksPerLane; ++q) {
      const int d = lane + q * kWarp;
      if (d < R) rows[d] = meta.pos[q] < 0 ? -1 : begin[q] + meta.pos[q];
    }
    __syncwarp();
    const int following = __shfl_sync(0xffffffffu, t_next, 0);
    if (following < T) {  // used in the next round: the loads' latency hides behind this row
      load_inputs(meta_next, in, following, lane);
      load_positions(meta_next, a.handle, following, R, lane);
    }
    int t_after = T;
    if (lane == 0) {
      if (following < T) {  // the stage of row i + 1 last held row i + 1 - kStages: its stores must have read it
        const int next = (i + 1) % kStages;
        t_after = claim();
        bulk_wait_read<kStages - 2>();
        mbarrier_expect_bytes(&loaded[warp][next], row_bytes);
        bulk_load(stages + next * row_bytes, row_of(following), row_bytes, &loaded[warp][next]);
      }
      ok = mbarrier_wait(b.team, &loaded[warp][s], (i / kStages) & 1,
                         transport::WaitSite{transport::WaitPhase::ht_bulk_load, me, uint32_t(t)});
      if (ok) {
        for (int d = 0; d < R; ++d) {
          if (rows[d] >= 0)
            bulk_store(b.at<uint8_t>(d, b.recv_x) + int64_t(rows[d]) * row_bytes, stages + s * row_bytes, row_bytes);
        }
        bulk_commit();
        if (i == 0) transport::trace<transport::TracePoint::ht_dispatch_first_stores>(b.team);
      }
    }
    ok = __shfl_sync(0xffffffffu, ok, 0);
    // The row's metadata, from registers: src_idx, topk_idx as d's local expert ids (-1 elsewhere),
    // weights (0 where -1) and the FP8 scales.
    for (int d = 0; d < R; ++d) {
      const int32_t row = rows[d];
      if (row < 0) continue;
      if (lane == 0) b.at<int32_t>(d, b.recv_src_idx)[row] = t;
      if (lane < in.topk) {
        const bool here = meta.expert >= 0 && meta.expert / E_local == d;
        const int64_t local = here ? meta.expert - int64_t(d) * E_local : -1;
        if (in.topk_int64) {
          b.at<int64_t>(d, b.recv_topk_idx)[int64_t(row) * in.topk + lane] = local;
        } else {
          b.at<int32_t>(d, b.recv_topk_idx)[int64_t(row) * in.topk + lane] = int32_t(local);
        }
        b.at<float>(d, b.recv_topk_weights)[int64_t(row) * in.topk + lane] = here ? meta.weight : 0.0f;
      }
      float* scales = b.at<float>(d, b.recv_scales) + int64_t(row) * scale_cols;
#pragma unroll
      for (int q = 0; q < kScalesPerLane; ++q) {
        const int j = lane + q * kWarp;
        if (j < scale_cols) scales[j] = meta.scales[q];
      }
    }
    __syncwarp();  // rows[] is rewritten for the next token
    t = following;
    t_next = t_after;
    meta = meta_next;
  }
  if (lane == 0) {
    transport::trace<transport::TracePoint::ht_dispatch_last_stores>(b.team);
    bulk_wait_all();
    transport::trace<transport::TracePoint::ht_dispatch_stores_done>(b.team);
  }

  // A team that failed (a wait of this rank expired) signals nothing (signal_done).
  if (!signal_done(b, core::kDispatchDone, seq, a.blocks_done, a.tokens_claimed)) return;
  if (threadIdx.x == 0) {
    *sequence = seq;
    transport::trace<transport::TracePoint::ht_dispatch_signalled>(b.team);
  }
  wait_for_every_cta(b, core::kDispatchDone, seq, transport::WaitPhase::ht_dispatch_done);
  if (threadIdx.x == 0) transport::trace<transport::TracePoint::ht_dispatch_end>(b.team);
}

}  // namespace

static_assert(std::size_t(kStages) * 2 * kMaxHidden <= kStageBudget, "a BF16 row of kMaxHidden must fit the stages");

void prepare_kernels() {
  detail::allow_dynamic_shared_memory(reinterpret_cast<const void*>(dispatch_kernel), int(kStageBudget),
                                      "cudaFuncSetAttribute(HT dispatch_kernel)");
  load_layout_kernel();
  load_combine_kernel();
  load_stage_combine_input_kernel();
}

void launch_dispatch(const DispatchArgs& args, int num_blocks, bool after_layout, cudaStream_t stream) {
  const std::size_t per_warp = std::size_t(kStages) * args.tokens.x_row_bytes;
  const int warps = int(std::max<std::size_t>(1, std::min<std::size_t>(kMaxWarps, kStageBudget / per_warp)));
  // Dependent only behind our own layout kernel, which writes nothing the kernel reads before
  // wait_for_prior_grid: behind a caller's kernel, the first row loads could read x before that kernel
  // has written it.
  launch(dispatch_kernel, dim3(num_blocks), dim3(warps * kWarp), warps * per_warp, stream, after_layout,
         "launching HT dispatch_kernel", args);
}

}  // namespace epx::kernels::ht
