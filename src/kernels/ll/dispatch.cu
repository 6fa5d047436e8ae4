// LL dispatch: one dedup message per (token, destination rank), written straight into the
// destination's receive area; each receiver then expands the messages into the caller's packed layout.
//
// Protocol, for buffer set `set` (areas of core::LlAreas; flags, the sequence number seq and the
// "set is free" wait as in protocol.cuh).
//   Send (rank me). Every CTA first stages my top-k table in shared memory (int16, -1 for none, an
//   invalid id or an expert of a masked rank; CTA 0 records the first invalid id). A warp waits until the
//   peers have freed the set before its first remote store.
//     * Columns (every warp), token t and 512 columns: payload(r, set, me, t) = the row (BF16, or FP8
//       cast once here, then its float scales) for every destination rank r of t. The warp of the
//       first columns also writes header(r, set, me, t): seq, slots, unique_slots, and per slot the
//       expert, weight and block_row (how many of my tokens before t name that expert: t's place
//       among them), and home(set, t) (t's destination ranks ascending and valid slots, for combine).
//     * Counts (the last CTA, before its columns): expert_counts(r, set, me) = my tokens per local
//       expert of r.
//     Plain stores over NVLink. Then the last CTA writes tokens(r, set, me) = T and signals ready on
//     every rank r (also those that get no message).
//   Receive (rank me): every CTA waits until every source has signalled ready (a masked source counts
//   as having sent no token, see protocol.cuh). Expert e's rows
//     are source ranks ascending, tokens ascending: the message of (s, t) goes to row begin(e, s) +
//     block_row of every unique slot naming e, where begin(e, s) is the sum of expert_counts(me, set,
//     s')[e] over s' < s; src_idx too; CTA 0 writes layout_range, recv_count and the statistics. A
//     header whose seq is not this call's is stale: that token did not come here this time. What
//     combine needs of each message (slots, each slot's packed row and weight) is kept in private
//     memory, so the set is not read after this step. Warps take (message, part of its payload) work
//     items; then the last CTA signals freed to every source.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "core/cuda_check.hpp"
#include "kernels/common/grid.cuh"
#include "kernels/common/topk.cuh"
#include "kernels/ll/ll_view.hpp"
#include "kernels/ll/protocol.cuh"
#include "transport/device/wait.cuh"

namespace epx::kernels::ll {
namespace {

constexpr int kThreads = 512;
static_assert(kThreads >= kMaxNvlinkRanks, "send() loads one rank's mask per thread");
constexpr int kWarps = kThreads / kWarp;
constexpr int kColsPerLane = 16;                       // two 16-byte vectors of BF16
constexpr int kColsPerItem = kWarp * kColsPerLane;     // a send work item: 512 columns of one token
constexpr int kGroup = 128;                            // columns per FP8 scale
constexpr int kLanesPerGroup = kGroup / kColsPerLane;  // 8
constexpr int kCopyBatch = 8;                          // vectors each lane loads before it stores
constexpr float kAmaxFloor = 1e-4f;
constexpr float kE4m3Max = 448.0f;

using core::LlHomeToken;
using core::LlMessageHeader;

// ---- Send ----

// The expert of slot k of token t; an id outside [-1, E) counts as -1, and is recorded (the first on
// this rank) when `record` is set. Read once per entry and CTA, into the staged table (see send).
__device__ int64_t checked_expert(const DispatchParams& p, int t, int k, bool record) {
  if (k >= p.topk) return -1;
  const int64_t e = topk_at(p.topk_idx, p.topk_int64, p.topk_row_stride, t, k);
  if (e >= -1 && e < p.v.num_experts) return e;
  LlHostReport* report = p.v.host_report;
  if (record && atomicCAS(&report->input_error, 0, 1) == 0) {
    report->token = t;
    report->slot = k;
    report->value = e;
  }
  return -1;
}

// The scale rule of DESIGN.md §1.2 (reference/include/epx/reference/fp8_cast.hpp), with IEEE division.
__device__ float fp8_scale(float amax, bool round_scale) {
  float scale = fmaxf(amax, kAmaxFloor) / kE4m3Max;
  if (round_scale) {
    const uint32_t bits = __float_as_uint(scale);
    if ((bits & 0x007FFFFFu) != 0u) scale = __uint_as_float((bits & 0x7F800000u) + 0x00800000u);
  }
  return scale;
}

__device__ void unpack_bf16(const uint4& v, float* out) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(w[i] << 16);
    out[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
  }
}

// This lane's 16 columns as FP8 (one 16-byte vector) and its group's scale; all lanes take part.
__device__ uint4 cast_to_fp8(const uint4 (&raw)[2], bool round_scale, float* scale_out) {
  float f[kColsPerLane];
  unpack_bf16(raw[0], f);
  unpack_bf16(raw[1], f + 8);
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kColsPerLane; ++i) amax = fmaxf(amax, fabsf(f[i]));
#pragma unroll
  for (int offset = kLanesPerGroup / 2; offset > 0; offset /= 2) {
    amax = fmaxf(amax, __shfl_xor_sync(~0u, amax, offset));
  }
  const float scale = fp8_scale(amax, round_scale);
  const float inv = 1.0f / scale;
  uint32_t words[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t word = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const uint32_t q = __nv_cvt_float_to_fp8(__fmul_rn(f[4 * i + b], inv), __NV_SATFINITE, __NV_E4M3);
      word |= q << (8 * b);
    }
    words[i] = word;
  }
  *scale_out = scale;
  return make_uint4(words[0], words[1], words[2], words[3]);
}

// Lane k: how many of my tokens before t name slot k's expert (`expert`, -1: none), from the staged
// table; lane i looks at token t0 + i.
__device__ int tokens_before_naming(const DispatchParams& p, const int16_t* experts, int t, int64_t expert) {
  const int lane = threadIdx.x % kWarp;
  int before = 0;
  for (int t0 = 0; t0 < t; t0 += kWarp) {
    const int u = t0 + lane;
    int16_t theirs[core::kLlMaxTopk];  // token u's experts, in registers
#pragma unroll
    for (int j = 0; j < core::kLlMaxTopk; ++j) theirs[j] = u < t && j < p.topk ? experts[u * p.topk + j] : -1;
    for (int k = 0; k < p.topk; ++k) {
      const int64_t x = __shfl_sync(~0u, expert, k);
      bool names = false;
#pragma unroll
      for (int j = 0; j < core::kLlMaxTopk; ++j) names |= theirs[j] == x;
      const uint32_t naming = __ballot_sync(~0u, names && x >= 0);
      if (lane == k) before += __popc(naming);
    }
  }
  return before;
}

// The first columns' warp of token t: the headers of its messages and its home record. Lane k holds
// slot k's expert and rank; `same_rank`: the lanes whose expert lives on this lane's rank; `leaders`:
// the lowest such lane of each destination rank.
__device__ void write_routing(const DispatchParams& p, const int16_t* experts, uint64_t seq, int t, int64_t expert,
                              int rank, uint32_t same_rank, uint32_t leaders) {
  const LlView& v = p.v;
  const int lane = threadIdx.x % kWarp;
  const bool leader = (leaders >> lane) & 1u;
  const uint32_t same_expert = __match_any_sync(~0u, expert);
  const int block_row = tokens_before_naming(p, experts, t, expert);
  if (rank >= 0) {
    LlMessageHeader* h = v.header(rank, p.set, v.team.rank, t);
    h->expert[lane] = int16_t(expert - int64_t(rank) * v.experts_per_rank());
    h->block_row[lane] = int16_t(block_row);
    h->weight[lane] = p.weights != nullptr ? p.weights[t * p.weights_row_stride + lane] : 0.0f;
    const uint32_t first_of_expert = __ballot_sync(same_rank, lane == __ffs(same_expert) - 1);
    if (leader) {
      h->slots = same_rank;
      h->unique_slots = first_of_expert;
      h->seq = uint32_t(seq);
    }
  }
  const uint32_t valid_slots = __ballot_sync(~0u, rank >= 0);
  int position = 0;  // among the destination ranks, ascending
  for (uint32_t rest = leaders; rest != 0u; rest &= rest - 1u) {
    const int other = __shfl_sync(~0u, rank, __ffs(rest) - 1);
    position += leader && other < rank;
  }
  LlHomeToken* home = v.home_of(p.set, t);
  if (leader) home->ranks[position] = int8_t(rank);
  if (lane < core::kLlMaxTopk) home->slot_ranks[lane] = int8_t(rank);
  if (lane == 0) {
    home->num_ranks = __popc(leaders);
    home->slots = valid_slots;
  }
}

// Before a warp's first remote store of the call: the destination sets are free (see protocol.cuh).
// Returns false when the team failed.
__device__ bool ensure_set_free(const DispatchParams& p, uint64_t seq, bool& free) {
  if (!free) free = wait_set_free(p.v, core::kLlDispatch, p.set, seq);
  return free;
}

// One warp: 512 columns of token t to every destination rank. Returns false when the team failed.
__device__ bool send_columns(const DispatchParams& p, const int16_t* experts, uint64_t seq, int t, int chunk,
                             bool& free) {
  const LlView& v = p.v;
  const int lane = threadIdx.x % kWarp;
  const int col = chunk * kColsPerItem + lane * kColsPerLane;
  const bool active = col < p.hidden;  // H % 128 == 0: a scale group is all active or all idle
  uint4 raw[2] = {};
  if (active) {
    const uint4* src = reinterpret_cast<const uint4*>(p.x + t * p.x_row_stride + col);
    raw[0] = src[0];
    raw[1] = src[1];
  }
  const int64_t expert = lane < p.topk ? experts[t * p.topk + lane] : -1;
  const int rank = expert >= 0 ? int(expert / v.experts_per_rank()) : -1;
  const uint32_t same_rank = __match_any_sync(~0u, rank);
  const uint32_t leaders = __ballot_sync(~0u, rank >= 0 && lane == __ffs(same_rank) - 1);
  if (!ensure_set_free(p, seq, free)) return false;
  if (chunk == 0) write_routing(p, experts, seq, t, expert, rank, same_rank, leaders);
  float scale = 0.0f;
  const uint4 fp8 = p.fp8 ? cast_to_fp8(raw, p.round_scale, &scale) : uint4{};
  for (uint32_t rest = leaders; rest != 0u; rest &= rest - 1u) {
    const int dest = __shfl_sync(~0u, rank, __ffs(rest) - 1);
    if (!active) continue;
    char* slot = v.payload(dest, p.set, v.team.rank, t);
    if (p.fp8) {
      *reinterpret_cast<uint4*>(slot + col) = fp8;
      if (lane % kLanesPerGroup == 0) reinterpret_cast<float*>(slot + p.hidden)[col / kGroup] = scale;
    } else {
      uint4* dst = reinterpret_cast<uint4*>(slot + 2 * col);
      dst[0] = raw[0];
      dst[1] = raw[1];
    }
  }
  return true;
}

// ---- Send: expert counts ----
// The last CTA counts my tokens per expert (a token naming one expert in two slots counts once) and
// writes each rank's counts, [E_local] int32, to expert_counts(rank, set, me). Returns false when the
// team failed.
__device__ bool send_expert_counts(const DispatchParams& p, const int16_t* experts, const bool* masked, int32_t* counts,
                                   uint64_t seq, bool& free) {
  const LlView& v = p.v;
  const int K = p.topk;
  for (int e = threadIdx.x; e < v.num_experts; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < p.num_tokens * K; i += blockDim.x) {
    const int e = experts[i];
    bool repeated = false;
    for (int j = i - i % K; j < i; ++j) repeated |= experts[j] == e;
    if (e >= 0 && !repeated) atomicAdd(&counts[e], 1);
  }
  __syncthreads();
  if (!ensure_set_free(p, seq, free)) return false;
  const int E_local = v.experts_per_rank();
  for (int e = threadIdx.x; e < v.num_experts; e += blockDim.x) {
    if (!masked[e / E_local]) v.expert_counts_of(e / E_local, p.set, v.team.rank)[e % E_local] = counts[e];
  }
  return true;
}

// Dynamic shared memory of the send step: my experts [T][K] (int16, -1 for none or an invalid id),
// then (the counting CTA) int32 counts [E].
__host__ __device__ inline std::size_t experts_table_bytes(int num_tokens, int topk) {
  return (std::size_t(num_tokens) * topk * sizeof(int16_t) + 15) / 16 * 16;
}

__device__ void send(const DispatchParams& p, uint64_t seq) {
  extern __shared__ int4 send_shared[];
  __shared__ bool masked[kMaxNvlinkRanks];
  int16_t* experts = reinterpret_cast<int16_t*>(send_shared);
  int32_t* counts =
      reinterpret_cast<int32_t*>(reinterpret_cast<char*>(send_shared) + experts_table_bytes(p.num_tokens, p.topk));
  const LlView& v = p.v;
  // Every CTA stages my top-k table once; CTA 0 records the first invalid id. Experts of masked ranks
  // become -1 in a second pass (only when a rank is masked). The mask is loaded first, so that its
  // latency hides behind the table's (kThreads >= kMaxNvlinkRanks: one rank per thread).
  const bool rank_masked = int(threadIdx.x) < v.team.nranks && is_masked(v, threadIdx.x);
  const int entries = p.num_tokens * p.topk;
  for (int i = threadIdx.x; i < entries; i += blockDim.x) {
    experts[i] = int16_t(checked_expert(p, i / p.topk, i % p.topk, blockIdx.x == 0));
  }
  if (int(threadIdx.x) < v.team.nranks) masked[threadIdx.x] = rank_masked;
  if (__syncthreads_or(rank_masked)) {  // its barrier also publishes the table and the mask
    for (int i = threadIdx.x; i < entries; i += blockDim.x) {
      if (experts[i] >= 0 && masked[experts[i] / v.experts_per_rank()]) experts[i] = -1;
    }
    __syncthreads();
  }
  bool free = false;  // this warp has seen the set freed by every peer
  const bool counting = blockIdx.x == gridDim.x - 1;
  bool ok = !counting || send_expert_counts(p, experts, masked, counts, seq, free);
  // Column items: the counting CTA's warps last.
  const int chunks = (p.hidden + kColsPerItem - 1) / kColsPerItem;
  const int warps = gridDim.x * kWarps;
  for (int i = blockIdx.x * kWarps + threadIdx.x / kWarp; ok && i < p.num_tokens * chunks; i += warps) {
    ok = send_columns(p, experts, seq, i / chunks, i % chunks, free);
  }
  last_cta_signals(v, v.blocks_done_of(core::kLlDispatch, kLlSend), masked, core::kLlReady, core::kLlDispatch, p.set,
                   seq, [&](int r) { *v.tokens_of(r, p.set, v.team.rank) = p.num_tokens; });
}

// ---- Receive ----

// One message's routing as lane k of a warp sees it (slot k): the packed row it expands to.
struct MessageRows {
  uint32_t slots;         // the message's slots (0: no message from this token this time)
  uint32_t unique_slots;  // those that get a row of their own
  int32_t row;            // lane k: packed row e * C + i of slot k (valid where slots has bit k)
  float weight;           // lane k: slot k's weight
};

// Reads the header of (s, t) and finds each slot's row: expert e's rows from source s start after the
// rows of unmasked sources s' < s (expert_counts), and the token's place among them is block_row. The
// header's fields are loaded together, before the validity check. `masked`: the CTA's view of the mask.
__device__ MessageRows message_rows(const DispatchParams& p, const bool* masked, uint32_t seq, int s, int t) {
  const LlView& v = p.v;
  const int lane = threadIdx.x % kWarp, me = v.team.rank;
  const LlMessageHeader* h = v.header(me, p.set, s, t);
  const int tokens = masked[s] ? 0 : *v.tokens_of(me, p.set, s);
  const uint32_t header_seq = h->seq, slots = h->slots, unique_slots = h->unique_slots;
  const int k = lane % core::kLlMaxTopk;
  const int e = h->expert[k], block_row = h->block_row[k];
  const float weight = h->weight[k];
  const bool sent = t < tokens && header_seq == seq;
  MessageRows m{sent ? slots : 0u, sent ? unique_slots : 0u, -1, 0.0f};
  if ((m.slots >> lane) & 1u) {
    int32_t begin = 0;
    for (int earlier = 0; earlier < s; ++earlier) {
      if (!masked[earlier]) begin += v.expert_counts_of(me, p.set, earlier)[e];
    }
    m.row = int32_t(e * v.rows_per_expert() + begin + block_row);
    m.weight = weight;
  }
  return m;
}

// One warp, part `part` of `parts` of message (s, t): part 0 records the message for combine
// (message_slots, entry_rows, entry_weights) and src_idx, and copies the scales; every part copies its
// share of the payload's 16-byte vectors, each loaded once and stored into every row it expands to.
__device__ void receive_message(const DispatchParams& p, const bool* masked, uint32_t seq, int s, int t, int part,
                                int parts) {
  const LlView& v = p.v;
  const int lane = threadIdx.x % kWarp, me = v.team.rank;
  const char* payload = v.payload(me, p.set, s, t);
  const int row_bytes = p.fp8 ? p.hidden : 2 * p.hidden;
  const int vectors = row_bytes / 16;
  const int per_part = (vectors + parts - 1) / parts;
  const int first = part * per_part, last = min(vectors, first + per_part);
  // The first batch is loaded before the header is read (a message that did not come is not stored).
  uint4 batch[kCopyBatch];
  const auto load_batch = [&](int base) {
#pragma unroll
    for (int b = 0; b < kCopyBatch; ++b) {
      const int u = base + b * kWarp + lane;
      if (u < last) batch[b] = reinterpret_cast<const uint4*>(payload)[u];
    }
  };
  load_batch(first);
  const MessageRows m = message_rows(p, masked, seq, s, t);
  if (part == 0) {
    if (lane == 0) *v.message_slots_of(p.set, s, t) = m.slots;
    if ((m.slots >> lane) & 1u) {
      v.entry_rows_of(p.set, s, t)[lane] = m.row;
      v.entry_weights_of(p.set, s, t)[lane] = m.weight;
      if ((m.unique_slots >> lane) & 1u) p.src_idx[m.row] = t;
    }
  }
  if (m.slots == 0u) return;
  char* out = static_cast<char*>(p.out_x);
  for (int base = first; base < last; base += kWarp * kCopyBatch) {
    if (base != first) load_batch(base);
    for (uint32_t rest = m.unique_slots; rest != 0u; rest &= rest - 1u) {
      uint4* row = reinterpret_cast<uint4*>(out + int64_t(__shfl_sync(~0u, m.row, __ffs(rest) - 1)) * row_bytes);
#pragma unroll
      for (int b = 0; b < kCopyBatch; ++b) {
        const int u = base + b * kWarp + lane;
        if (u < last) row[u] = batch[b];
      }
    }
  }
  if (!p.fp8 || part != parts - 1) return;
  const LlScalesLayout& l = p.scales_layout;
  const int64_t C = v.rows_per_expert();
  const float* scales = reinterpret_cast<const float*>(payload + p.hidden);
  const int groups = p.hidden / kGroup;
  const int words = p.ue8m0 ? groups / 4 : groups;  // UE8M0: four scale exponents per int32
  for (int w0 = 0; w0 < words; w0 += kWarp) {
    const int w = w0 + lane;
    uint32_t value = 0;
    if (w < words && p.ue8m0) {
      for (int b = 0; b < 4; ++b) value |= ((__float_as_uint(scales[4 * w + b]) >> 23) & 0xFFu) << (8 * b);
    } else if (w < words) {
      value = __float_as_uint(scales[w]);
    }
    for (uint32_t rest = m.unique_slots; rest != 0u; rest &= rest - 1u) {
      const int64_t row = __shfl_sync(~0u, m.row, __ffs(rest) - 1);
      const int64_t e = row / C, i = row % C;
      if (w < words)
        static_cast<uint32_t*>(p.out_scales)[e * l.expert_stride + i * l.row_stride + w * l.col_stride] = value;
    }
  }
}

__device__ void receive(const DispatchParams& p, uint64_t seq) {
  const LlView& v = p.v;
  const int R = v.team.nranks, me = v.team.rank;
  __shared__ bool masked[kMaxNvlinkRanks];
  if (!wait_every_peer(v, core::kLlDispatch, p.set, seq, transport::WaitPhase::ll_dispatch_recv, masked)) return;
  if (blockIdx.x == 0) {  // the per-expert outputs
    for (int e = threadIdx.x; e < v.experts_per_rank(); e += blockDim.x) {
      int32_t begin = 0;
      for (int s = 0; s < R; ++s) {
        const int32_t count = masked[s] ? 0 : v.expert_counts_of(me, p.set, s)[e];
        p.layout_range[e * R + s] = LlRange{begin, count};
        begin += count;
      }
      p.recv_count[e] = begin;
      if (p.cumulative_recv_count != nullptr) p.cumulative_recv_count[e] += begin;
    }
  }
  // Work items: (message, part), parts chosen so that every warp of the grid has about one.
  const int messages = R * v.max_tokens;
  const int warps = gridDim.x * kWarps;
  const int parts = max(1, min(warps / messages, 8));
  for (int item = blockIdx.x * kWarps + threadIdx.x / kWarp; item < messages * parts; item += warps) {
    const int message = item / parts;
    receive_message(p, masked, uint32_t(seq), message / v.max_tokens, message % v.max_tokens, item % parts, parts);
  }
  last_cta_signals(v, v.blocks_done_of(core::kLlDispatch, kLlReceive), masked, core::kLlFreed, core::kLlDispatch, p.set,
                   seq, [](int) {});
}

__global__ void __launch_bounds__(kThreads) dispatch_kernel(DispatchParams p) {
  const uint64_t seq = call_sequence(p.v, core::kLlDispatch, p.set);
  if (p.phases & kSend) send(p, seq);
  if (p.phases & kReceive) receive(p, seq);
}

}  // namespace

constexpr std::size_t kMaxSendShared =
    (std::size_t(core::kLlMaxTokens) * core::kLlMaxTopk * sizeof(int16_t)) + core::kLlMaxExperts * sizeof(int32_t);

void load_dispatch_kernel() {
  detail::allow_dynamic_shared_memory(reinterpret_cast<const void*>(dispatch_kernel), int(kMaxSendShared),
                                      "cudaFuncSetAttribute(LL dispatch kernel)");
  detail::load_kernel(reinterpret_cast<const void*>(dispatch_kernel), "LL dispatch kernel");
}

void launch_dispatch(const DispatchParams& params, int num_blocks, cudaStream_t stream) {
  const std::size_t shared = (params.phases & kSend) == 0 ? 0
                                                          : experts_table_bytes(params.num_tokens, params.topk) +
                                                                std::size_t(params.v.num_experts) * sizeof(int32_t);
  dispatch_kernel<<<num_blocks, kThreads, shared, stream>>>(params);
  detail::check_launch("LL dispatch kernel");
}

}  // namespace epx::kernels::ll
