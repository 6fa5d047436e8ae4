// LL combine: the expert side sends each message's rows back to the token's home rank, reduced over
// its local experts (local order) or one per slot (naive order); the home rank adds them up.
//
// Protocol, for combine buffer set `set`, reversing the dispatch of set `dset` (areas of
// core::LlAreas; flags, the sequence number and the "set is free" wait as in protocol.cuh).
//   Send (expert side me): per message (s, t) that dispatch received (its private record: slots,
//   entry_rows, entry_weights) from a home rank s not masked now, split into parts over warps; a warp
//   waits until every home rank has freed `set` before its first remote store:
//     local: p = 0; for its slots k ascending: p = fmaf(weight_k, y[entry_rows_k], p); the BF16 of p
//            goes to combine_row(s, set, me, t) (a slot repeating an expert counts again, with its weight);
//     naive: y[entry_rows_k] goes to combine_row(s, set, k, t) for every slot k.
//     Then the last CTA signals ready to every rank.
//   Receive (home me): every CTA waits until every rank has signalled ready. Then
//     out[t] = BF16 of: local: the sum of float(combine_row(me, set, r, t)) over t's ranks r ascending
//     (home(dset, t)); naive: fmaf(w[t][k], float(combine_row(me, set, k, t)), acc) over t's valid
//     slots k ascending. Ranks masked now are left out (rank masking, protocol.cuh). A token with no
//     expert gets 0. Then the last CTA signals freed to every rank.
#include <cuda_bf16.h>

#include "core/cuda_check.hpp"
#include "kernels/common/grid.cuh"
#include "kernels/ll/ll_view.hpp"
#include "kernels/ll/protocol.cuh"
#include "transport/device/phase_trace.hpp"
#include "transport/device/wait.cuh"

namespace epx::kernels::ll {
namespace {

constexpr int kThreads = 512;
static_assert(kThreads >= kMaxNvlinkRanks, "send() loads one rank's mask per thread");
constexpr int kWarps = kThreads / kWarp;
constexpr int kColsPerLane = 16;                    // two 16-byte vectors of BF16
constexpr int kColsPerItem = kWarp * kColsPerLane;  // a work item: 512 columns of one row
constexpr int kRowsInFlight = 4;                    // rows whose vectors a lane loads before it adds

using core::LlHomeToken;

struct Vectors {  // one lane's 16 columns of a BF16 row
  uint4 v[2];
};

__device__ Vectors load_row(const uint16_t* row, int col) {
  const uint4* p = reinterpret_cast<const uint4*>(row + col);
  return Vectors{{p[0], p[1]}};
}

__device__ void store_row(uint16_t* row, int col, const Vectors& x) {
  uint4* p = reinterpret_cast<uint4*>(row + col);
  p[0] = x.v[0];
  p[1] = x.v[1];
}

__device__ float bf16_at(const Vectors& x, int i) {
  const uint32_t w = (&x.v[0].x)[i / 2];
  return __uint_as_float(i % 2 == 0 ? w << 16 : w & 0xFFFF0000u);
}

__device__ Vectors to_bf16(const float (&acc)[kColsPerLane]) {
  Vectors out;
  uint32_t* w = &out.v[0].x;
#pragma unroll
  for (int i = 0; i < kColsPerLane / 2; ++i) {
    const __nv_bfloat162 pair = __float22bfloat162_rn(make_float2(acc[2 * i], acc[2 * i + 1]));
    w[i] = *reinterpret_cast<const uint32_t*>(&pair);
  }
  return out;
}

// ---- Send ----

// One warp, part `part` of `parts` of message (s, t): its columns of the message's rows back to the
// home rank s (local order: reduced; naive: one row per slot). Returns false when the team failed.
__device__ bool send_message(const CombineParams& p, uint64_t cseq, int s, int t, int part, int parts, bool& free) {
  const LlView& v = p.v;
  const int me = v.team.rank, lane = threadIdx.x % kWarp;
  const uint32_t slots = *v.message_slots_of(p.dispatch_set, s, t);
  const int k = lane % core::kLlMaxTopk;
  const int32_t row_of_slot = v.entry_rows_of(p.dispatch_set, s, t)[k];
  const float weight_of_slot = v.entry_weights_of(p.dispatch_set, s, t)[k];
  const bool home_masked = is_masked(v, s);     // loaded with the record, not after it
  if (slots == 0u || home_masked) return true;  // no message from (s, t) in that dispatch, or s is masked
  if (!free) free = wait_set_free(v, core::kLlCombine, p.set, cseq);
  if (!free) return false;
  const int chunks = (p.hidden + kColsPerItem - 1) / kColsPerItem;
  for (int chunk = part; chunk < chunks; chunk += parts) {
    const int col = chunk * kColsPerItem + lane * kColsPerLane;
    const bool active = col < p.hidden;
    if (p.naive) {
      for (uint32_t rest = slots; rest != 0u; rest &= rest - 1u) {
        const int slot = __ffs(rest) - 1;
        const int32_t row = __shfl_sync(~0u, row_of_slot, slot);
        if (active) store_row(v.combine_row(s, p.set, slot, t), col, load_row(p.y + row * p.y_row_stride, col));
      }
      continue;
    }
    float acc[kColsPerLane] = {};
    for (uint32_t rest = slots; rest != 0u;) {
      int slot[kRowsInFlight];
      Vectors in[kRowsInFlight];
#pragma unroll
      for (int b = 0; b < kRowsInFlight; ++b) {
        slot[b] = rest != 0u ? __ffs(rest) - 1 : -1;
        rest &= rest - 1u;
        const int32_t row = __shfl_sync(~0u, row_of_slot, max(slot[b], 0));
        if (slot[b] >= 0 && active) in[b] = load_row(p.y + row * p.y_row_stride, col);
      }
#pragma unroll
      for (int b = 0; b < kRowsInFlight; ++b) {
        const float w = __shfl_sync(~0u, weight_of_slot, max(slot[b], 0));
        if (slot[b] < 0 || !active) continue;
#pragma unroll
        for (int i = 0; i < kColsPerLane; ++i) acc[i] = __fmaf_rn(w, bf16_at(in[b], i), acc[i]);
      }
    }
    if (active) store_row(v.combine_row(s, p.set, me, t), col, to_bf16(acc));
  }
  return true;
}

__device__ void send(const CombineParams& p, uint64_t cseq) {
  __shared__ bool masked[kMaxNvlinkRanks];
  const LlView& v = p.v;
  // This CTA's view of the mask for the signals (loaded now, used at the end).
  const bool rank_masked = int(threadIdx.x) < v.team.nranks && is_masked(v, threadIdx.x);
  const int messages = v.team.nranks * v.max_tokens;
  const int warps = gridDim.x * kWarps;
  const int chunks = (p.hidden + kColsPerItem - 1) / kColsPerItem;
  const int parts = max(1, min(warps / messages, chunks));  // about one work item per warp
  bool free = false;                                        // this warp has seen the set freed by every home rank
  bool ok = true;
  for (int item = blockIdx.x * kWarps + threadIdx.x / kWarp; ok && item < messages * parts; item += warps) {
    const int message = item / parts;
    ok = send_message(p, cseq, message / v.max_tokens, message % v.max_tokens, item % parts, parts, free);
  }
  if (threadIdx.x % kWarp == 0) transport::trace<transport::TracePoint::ll_combine_sent>(v.team);
  if (int(threadIdx.x) < v.team.nranks) masked[threadIdx.x] = rank_masked;
  last_cta_signals(v, v.blocks_done_of(core::kLlCombine, kLlSend), masked, core::kLlReady, core::kLlCombine, p.set,
                   cseq, [&](int) { transport::trace<transport::TracePoint::ll_combine_signalled>(v.team); });
}

// ---- Receive ----

// One warp: 512 columns of out[t]. `masked`: the CTA's view of the mask (wait_every_peer).
__device__ void receive_item(const CombineParams& p, const bool* masked, int t, int chunk) {
  const LlView& v = p.v;
  const int me = v.team.rank, lane = threadIdx.x % kWarp;
  const int col = chunk * kColsPerItem + lane * kColsPerLane;
  if (col >= p.hidden) return;
  const LlHomeToken home = *v.home_of(p.dispatch_set, t);
  float acc[kColsPerLane] = {};
  if (p.naive) {
    for (uint32_t slots = home.slots; slots != 0u; slots &= slots - 1u) {
      const int k = __ffs(slots) - 1;
      if (masked[home.slot_ranks[k]]) continue;
      const float w = p.weights[t * p.weights_row_stride + k];
      const Vectors in = load_row(v.combine_row(me, p.set, k, t), col);
#pragma unroll
      for (int i = 0; i < kColsPerLane; ++i) acc[i] = __fmaf_rn(w, bf16_at(in, i), acc[i]);
    }
  } else {
    for (int i0 = 0; i0 < home.num_ranks; i0 += kRowsInFlight) {
      Vectors in[kRowsInFlight];
      bool used[kRowsInFlight];
#pragma unroll
      for (int b = 0; b < kRowsInFlight; ++b) {
        used[b] = i0 + b < home.num_ranks && !masked[home.ranks[i0 + b]];
        if (used[b]) in[b] = load_row(v.combine_row(me, p.set, home.ranks[i0 + b], t), col);
      }
#pragma unroll
      for (int b = 0; b < kRowsInFlight; ++b) {
        if (!used[b]) continue;
#pragma unroll
        for (int i = 0; i < kColsPerLane; ++i) acc[i] = __fadd_rn(acc[i], bf16_at(in[b], i));
      }
    }
  }
  store_row(p.out + t * p.out_row_stride, col, to_bf16(acc));
}

__device__ void receive(const CombineParams& p, uint64_t cseq) {
  const LlView& v = p.v;
  __shared__ bool masked[kMaxNvlinkRanks];
  if (!wait_every_peer(v, core::kLlCombine, p.set, cseq, transport::WaitPhase::ll_combine_recv, masked)) return;
  if (threadIdx.x == 0) transport::trace<transport::TracePoint::ll_combine_acquired>(v.team);
  const int chunks = (p.hidden + kColsPerItem - 1) / kColsPerItem;
  const int items = p.num_tokens * chunks;
  for (int item = blockIdx.x * kWarps + threadIdx.x / kWarp; item < items; item += gridDim.x * kWarps) {
    receive_item(p, masked, item / chunks, item % chunks);
  }
  if (threadIdx.x % kWarp == 0) transport::trace<transport::TracePoint::ll_combine_received>(v.team);
  last_cta_signals(v, v.blocks_done_of(core::kLlCombine, kLlReceive), masked, core::kLlFreed, core::kLlCombine, p.set,
                   cseq, [](int) {});
}

__global__ void __launch_bounds__(kThreads) combine_kernel(CombineParams p) {
  if (threadIdx.x == 0) transport::trace<transport::TracePoint::ll_combine_start>(p.v.team);
  const uint64_t cseq = call_sequence(p.v, core::kLlCombine, p.set);
  if (p.phases & kSend) send(p, cseq);
  if (p.phases & kReceive) receive(p, cseq);
  if (threadIdx.x == 0) transport::trace<transport::TracePoint::ll_combine_end>(p.v.team);
}

}  // namespace

void load_combine_kernel() { detail::load_kernel(reinterpret_cast<const void*>(combine_kernel), "LL combine kernel"); }

void launch_combine(const CombineParams& params, int num_blocks, cudaStream_t stream) {
  combine_kernel<<<num_blocks, kThreads, 0, stream>>>(params);
  detail::check_launch("LL combine kernel");
}

}  // namespace epx::kernels::ll
