// The LL dispatch's send step (its protocol: dispatch.cu). Included by dispatch.cu only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/common/bf16.cuh"
#include "kernels/common/topk.cuh"
#include "kernels/ll/dispatch_shared.cuh"
#include "transport/device/phase_trace.hpp"
#include "transport/device/wait.cuh"

namespace epx::kernels::ll {
namespace {

// `e`, the caller's top-k entry i of the flattened table (token i / K, slot i % K; from topk_at), as the
// staged table holds it: an id outside [-1, E) counts as -1, and is recorded (the first on this rank)
// when `record` is set. Read once per entry and CTA (see send).
__device__ int16_t checked_expert(const DispatchParams& p, int64_t e, int i, bool record) {
  if (e >= -1 && e < p.v.num_experts) return int16_t(e);
  LlHostReport* report = p.v.host_report;
  if (record && atomicCAS(&report->input_error, 0, 1) == 0) {
    report->token = i / p.topk;  // divisions on the error path only
    report->slot = i % p.topk;
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
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = bf16_at(v, i);
}

// The largest magnitude of 16 BF16 columns (a NaN counts as 0, as fmaxf has it). Pairs of columns at
// once, as BF16 (exact: a BF16 magnitude converts to float exactly, and __hmax2, like fmaxf, returns
// the other input when one is a NaN): a tree of 7 pair maxima instead of 16 unpacks and a chain of 16.
__device__ float amax_of(const uint4& a, const uint4& b) {
  const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  __nv_bfloat162 m[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) m[i] = __habs2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]));
#pragma unroll
  for (int n = 4; n >= 1; n /= 2) {
#pragma unroll
    for (int i = 0; i < n; ++i) m[i] = __hmax2(m[i], m[i + n]);
  }
  return fmaxf(0.0f, fmaxf(__low2float(m[0]), __high2float(m[0])));
}

// 8 BF16 columns as FP8 E4M3 (8 bytes), multiplied by inv = 1 / scale.
__device__ uint2 to_fp8(const uint4& raw, float inv) {
  float f[8];
  unpack_bf16(raw, f);
  uint32_t pairs[4];  // columns 2 i (low byte) and 2 i + 1, one conversion instruction each
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    pairs[i] = __nv_cvt_float2_to_fp8x2(make_float2(__fmul_rn(f[2 * i], inv), __fmul_rn(f[2 * i + 1], inv)),
                                        __NV_SATFINITE, __NV_E4M3);
  }
  return make_uint2(pairs[0] | pairs[1] << 16, pairs[2] | pairs[3] << 16);
}

// Lane k: how many of my tokens before t name slot k's expert (`expert`, -1: none), from the staged
// table, for K <= kSlots. Lane i counts over tokens i, i + 32, ... below t, every slot of t at once and
// with no cross-lane step (slot k's count in byte k % 4 of counts[k / 4]: at most kLlMaxTokens / 32 per
// lane); the warp adds each slot's bytes at the end.
template <int kSlots>
__device__ int tokens_before_naming(const DispatchParams& p, const int16_t* experts, int t, int expert) {
  static_assert(core::kLlMaxTokens / kWarp < 256, "a lane's count of one slot fits in a byte");
  const int lane = threadIdx.x % kWarp, K = p.topk;
  int32_t x[kSlots];  // t's experts, on every lane (-1: none)
#pragma unroll
  for (int k = 0; k < kSlots; ++k) x[k] = __shfl_sync(~0u, expert, k);
  uint32_t counts[kSlots / 4] = {};
  for (int u = lane; u < t; u += kWarp) {
    int32_t theirs[kSlots];
#pragma unroll
    for (int j = 0; j < kSlots; ++j) theirs[j] = j < K ? experts[u * K + j] : -1;
#pragma unroll
    for (int k = 0; k < kSlots; ++k) {
      bool names = false;
#pragma unroll
      for (int j = 0; j < kSlots; ++j) names |= theirs[j] == x[k];
      counts[k / 4] += uint32_t(names && x[k] >= 0) << (8 * (k % 4));
    }
  }
  int before = 0;
#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
    const int total = int(__reduce_add_sync(~0u, (counts[k / 4] >> (8 * (k % 4))) & 0xFFu));
    if (lane == k) before = total;
  }
  return before;
}

// The whole warp stores a header's kLlHeaderWords stamped words (see core::kLlHeaderSlots). Lane k holds
// slot k's expert and block row (16 bits each) and weight bits, 0 for a slot not in `slots`.
__device__ void write_header(LlWord* header, uint32_t stamp, uint32_t slots, uint32_t unique_slots, uint32_t expert,
                             uint32_t block_row, uint32_t weight) {
  using namespace core;
  const int lane = threadIdx.x % kWarp;
  // Lane w stores word w, and lanes w < kLlHeaderWords - 32 word 32 + w too (weights). Every lane takes
  // part in every shuffle; a lane uses only the values of its word's kind.
  const int pair = lane < kLlHeaderBlockRows ? lane - kLlHeaderExperts : lane - kLlHeaderBlockRows;
  const int even = (2 * max(pair, 0)) & (kWarp - 2);
  const uint32_t expert_lo = __shfl_sync(~0u, expert, even), expert_hi = __shfl_sync(~0u, expert, even + 1);
  const uint32_t row_lo = __shfl_sync(~0u, block_row, even), row_hi = __shfl_sync(~0u, block_row, even + 1);
  const uint32_t weight_here = __shfl_sync(~0u, weight, (lane - kLlHeaderWeights) & (kWarp - 1));
  const uint32_t weight_above = __shfl_sync(~0u, weight, (lane + kWarp - kLlHeaderWeights) & (kWarp - 1));
  uint32_t word = weight_here;
  if (lane == kLlHeaderSlots)
    word = slots;
  else if (lane == kLlHeaderUniqueSlots)
    word = unique_slots;
  else if (lane < kLlHeaderBlockRows)
    word = expert_lo | expert_hi << 16;
  else if (lane < kLlHeaderWeights)
    word = row_lo | row_hi << 16;
  store_word(header + lane, core::stamped(stamp, word));
  if (lane < kLlHeaderWords - kWarp) store_word(header + kWarp + lane, core::stamped(stamp, weight_above));
}

// What a routing item of token t writes: the headers (one per destination rank) and the home record.
// Lane k: slot k. Computed before the warp's "set is free" check.
struct Routing {
  uint32_t first_of_expert;            // the slots that get a row of their own (the first naming their expert)
  uint32_t local_expert, row, weight;  // lane k: slot k's header fields (0 for a slot without a rank)
};

// `weight`: lane k's load of slot k's weight bits (lanes >= K: anything).
__device__ Routing token_routing(const DispatchParams& p, const int16_t* experts, int t, int expert, int rank,
                                 uint32_t weight) {
  const LlView& v = p.v;
  const int lane = threadIdx.x % kWarp;
  const uint32_t same_expert = __match_any_sync(~0u, expert);
  const int block_row = p.topk <= 8 ? tokens_before_naming<8>(p, experts, t, expert)
                                    : tokens_before_naming<core::kLlMaxTopk>(p, experts, t, expert);
  const bool valid = rank >= 0;
  return Routing{__ballot_sync(~0u, valid && lane == __ffs(same_expert) - 1),
                 valid ? uint16_t(int16_t(expert - rank * v.experts_per_rank())) : 0u,
                 valid ? uint16_t(int16_t(block_row)) : 0u, valid && p.weights != nullptr ? weight : 0u};
}

// Token t's headers, one per destination rank; `leaders`: the lowest lane of each destination rank.
__device__ void write_headers(const DispatchParams& p, uint32_t stamp, int t, int rank, uint32_t leaders,
                              const Routing& r) {
  const LlView& v = p.v;
  for (uint32_t rest = leaders; rest != 0u; rest &= rest - 1u) {
    const int dest = __shfl_sync(~0u, rank, __ffs(rest) - 1);
    const bool mine = rank == dest;
    const uint32_t slots = __ballot_sync(~0u, mine);
    const uint32_t weights_at_combine = p.weights == nullptr ? core::kLlWeightsAtCombine : 0u;
    write_header(v.header(dest, p.set, v.team.rank, t), stamp, slots | weights_at_combine, r.first_of_expert & slots,
                 mine ? r.local_expert : 0u, mine ? r.row : 0u, mine ? r.weight : 0u);
  }
}

// Token t's home record (local, for combine).
__device__ void write_home(const DispatchParams& p, int t, int rank, uint32_t leaders) {
  const int lane = threadIdx.x % kWarp;
  const bool leader = (leaders >> lane) & 1u;
  const uint32_t valid_slots = __ballot_sync(~0u, rank >= 0);
  int position = 0;  // among the destination ranks, ascending
  for (uint32_t rest = leaders; rest != 0u; rest &= rest - 1u) {
    const int other = __shfl_sync(~0u, rank, __ffs(rest) - 1);
    position += leader && other < rank;
  }
  LlHomeToken* home = p.v.home_of(p.set, t);
  if (leader) home->ranks[position] = int8_t(rank);
  if (lane < core::kLlMaxTopk) home->slot_ranks[lane] = int8_t(rank);
  if (lane == 0) {
    home->num_ranks = __popc(leaders);
    home->slots = valid_slots;
  }
}

// Lane k < K: the bits of token t's slot k weight, if the call has weights (a load the caller issues
// early, see send).
__device__ uint32_t load_weight(const DispatchParams& p, int t) {
  const int lane = threadIdx.x % kWarp;
  return p.weights != nullptr && lane < p.topk ? __float_as_uint(p.weights[t * p.weights_row_stride + lane]) : 0u;
}

// One warp, item g of token t's row: this lane's loads of x (BF16 columns; none for a stamp lane),
// issued by load_item and turned into the vectors on the wire by finish_item, so that a warp's first item
// can be loaded before the kernel's other start-up loads and work (see send).
template <bool kFp8>
struct ItemLoads {
  uint4 raw[2][kFp8 ? 2 : 1];  // [instruction j][BF16 vectors of this lane's line vector]
};

template <bool kFp8>
__device__ ItemLoads<kFp8> load_item(const DispatchParams& p, int t, int g) {
  const int vector = line_vector(), bytes = row_bytes<kFp8>(p);
  const uint16_t* row = p.x + t * p.x_row_stride;
  ItemLoads<kFp8> l = {};
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int byte = line_byte(item_line(g, j));
    if (vector == kDataVectors || byte >= bytes) continue;  // the stamp lane loads nothing
      // FP8: byte = column, two vectors of 8 BF16 columns; BF16: byte / 2 = column, one vector.
#pragma unroll
    for (int k = 0; k < (kFp8 ? 2 : 1); ++k)
      l.raw[j][k] = *reinterpret_cast<const uint4*>(row + (kFp8 ? byte + 8 * k : byte / 2));
  }
  return l;
}

// One warp: this lane's vectors of item g as they go on the wire (the stamp vectors, of call seq,
// included), from its loads `l`. FP8: the warp reduces each group's amax (a group spans lanes of both
// instructions), and line 8 g + j's stamp vector carries group 7 g + j's scale (j < 7). The stamp is
// worked out where it is stored: the cast does not wait for the sequence number's load.
template <bool kFp8>
__device__ void finish_item(const DispatchParams& p, uint64_t seq, int g, const ItemLoads<kFp8>& l, uint4 (&x)[2]) {
  const int vector = line_vector(), bytes = row_bytes<kFp8>(p);
  int line[2], byte[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    line[j] = item_line(g, j);
    byte[j] = vector < kDataVectors ? line_byte(line[j]) : bytes;
  }
  if (!kFp8) {
#pragma unroll
    for (int j = 0; j < 2; ++j)
      x[j] = vector == kDataVectors ? make_uint4(core::ll_stamp(seq), 0u, 0u, 0u) : l.raw[j][0];
    return;
  }
  // Each group's amax over the warp (float bits >= 0 order as the floats; a lane's vectors count in
  // their group, -1 for none); lane k < kItemGroups works out group k's scale and its inverse, and
  // every lane takes those of its vectors' groups (the stamp lanes: of the group its line carries).
  const int lane = threadIdx.x % kWarp, item_byte = kLinesPerItem * core::kLlLineDataBytes * g;
  int group[2];
  uint32_t amax[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    group[j] = byte[j] < bytes ? (byte[j] - item_byte) / kGroup : -1;
    amax[j] = group[j] >= 0 ? __float_as_uint(amax_of(l.raw[j][0], l.raw[j][1])) : 0u;
  }
  uint32_t group_amax = 0u;  // lane k < kItemGroups: group k's
#pragma unroll
  for (int k = 0; k < kItemGroups; ++k) {
    const uint32_t m = __reduce_max_sync(~0u, max(group[0] == k ? amax[0] : 0u, group[1] == k ? amax[1] : 0u));
    if (lane == k) group_amax = m;
  }
  const float group_scale = fp8_scale(__uint_as_float(group_amax), p.round_scale);
  const float group_inv = 1.0f / group_scale;
  const int groups = p.hidden / kGroup;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int k = line[j] % kLinesPerItem;  // the group a stamp lane's line carries
    const int from = vector == kDataVectors ? k : max(group[j], 0);
    const float scale = __shfl_sync(~0u, group_scale, from), inv = __shfl_sync(~0u, group_inv, from);
    if (vector == kDataVectors) {
      const bool carries = k < kItemGroups && kItemGroups * g + k < groups;
      x[j] = make_uint4(core::ll_stamp(seq), __float_as_uint(carries ? scale : 0.0f), 0u, 0u);
    } else if (byte[j] < bytes) {
      const uint2 lo = to_fp8(l.raw[j][0], inv), hi = to_fp8(l.raw[j][1], inv);
      x[j] = make_uint4(lo.x, lo.y, hi.x, hi.y);
    } else {
      x[j] = make_uint4(0u, 0u, 0u, 0u);
    }
  }
}

// Before a warp's first remote store of the call: the set is free at every peer (ensure_set_free).
__device__ bool set_free(const DispatchParams& p, uint64_t seq, SetFree& free) {
  return ensure_set_free<transport::TracePoint::ll_dispatch_free>(p.v, core::kLlDispatch, p.set, seq, free);
}

// Lane k < K: slot k's expert (-1: none) and its rank (-1: none); `leaders`: the lowest lane of each
// destination rank of token t, from the staged table.
struct TokenRanks {
  int expert;
  int rank;
  uint32_t leaders;
};
__device__ TokenRanks token_ranks(const DispatchParams& p, const int16_t* experts, int t) {
  const int lane = threadIdx.x % kWarp;
  const int expert = lane < p.topk ? experts[t * p.topk + lane] : -1;
  const int rank = expert >= 0 ? int(p.v.by_local_experts.quotient(uint32_t(expert))) : -1;
  const uint32_t same_rank = __match_any_sync(~0u, rank);
  return TokenRanks{expert, rank, __ballot_sync(~0u, rank >= 0 && lane == __ffs(same_rank) - 1)};
}

// One warp: token t's routing, its headers to every destination rank and its home record. `weight`:
// load_weight's. Returns false when the team failed.
__device__ bool send_routing(const DispatchParams& p, const int16_t* experts, uint64_t seq, int t, uint32_t weight,
                             SetFree& free) {
  const TokenRanks to = token_ranks(p, experts, t);
  const Routing routing = token_routing(p, experts, t, to.expert, to.rank, weight);
  if (!set_free(p, seq, free)) return false;
  write_headers(p, core::ll_stamp(seq), t, to.rank, to.leaders, routing);
  write_home(p, t, to.rank, to.leaders);
  if (threadIdx.x % kWarp == 0) transport::trace<transport::TracePoint::ll_dispatch_routing>(p.v.team);
  return true;
}

// One warp: item g of token t (its vectors `x`, load_item) to every destination rank. Returns false when
// the team failed.
template <bool kFp8>
__device__ bool send_item(const DispatchParams& p, const int16_t* experts, uint64_t seq, int t, int g,
                          const uint4 (&x)[2], SetFree& free) {
  const TokenRanks to = token_ranks(p, experts, t);
  if (!set_free(p, seq, free)) return false;
  const int lines = row_lines<kFp8>(p);
  for (uint32_t rest = to.leaders; rest != 0u; rest &= rest - 1u) {
    const int dest = __shfl_sync(~0u, to.rank, __ffs(rest) - 1);
    store_lines(p.v.payload(dest, p.set, p.v.team.rank, t), 2 * g, lines, x);
  }
  return true;
}

// ---- Send: counts and manifests ----
// The last CTA counts my tokens per expert (a token naming one expert in two slots counts once) and writes
// each unmasked rank's counts, [E_local] stamped words, to expert_counts(rank, set, me); then every word
// of each unmasked rank's manifest (which of my tokens send it a message). Returns false when the team
// failed.
__device__ bool send_counts_and_manifests(const DispatchParams& p, const int16_t* experts, const bool* masked,
                                          int32_t* counts, uint64_t seq, SetFree& free) {
  const LlView& v = p.v;
  const int K = p.topk, lane = threadIdx.x % kWarp, E_local = v.experts_per_rank();
  const uint32_t stamp = core::ll_stamp(seq);
  for (int e = threadIdx.x; e < v.num_experts; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < p.num_tokens * K; i += blockDim.x) {
    const int e = experts[i];
    bool repeated = false;
    for (int j = int(p.by_topk.quotient(uint32_t(i))) * K; j < i; ++j) repeated |= experts[j] == e;
    if (e >= 0 && !repeated) atomicAdd(&counts[e], 1);
  }
  __syncthreads();
  if (!set_free(p, seq, free)) return false;
  for (int e = threadIdx.x; e < v.num_experts; e += blockDim.x) {
    const int r = int(v.by_local_experts.quotient(uint32_t(e)));
    if (!masked[r])
      store_word(v.expert_counts_of(r, p.set, v.team.rank) + (e - r * E_local), core::stamped(stamp, counts[e]));
  }
  // Manifests: a warp per (rank, word); lane i looks at token 32 j + i.
  const int words = core::ll_manifest_words(v.max_tokens);
  for (int item = threadIdx.x / kWarp; item < v.team.nranks * words; item += kWarps) {
    const int r = item / words, j = item % words, t = j * kWarp + lane;
    if (masked[r]) continue;
    bool sends = false;
    for (int k = 0; t < p.num_tokens && k < K; ++k) {
      const int e = experts[t * K + k];
      sends |= e >= 0 && int(v.by_local_experts.quotient(uint32_t(e))) == r;
    }
    const uint32_t bits = __ballot_sync(~0u, sends);
    if (lane == 0) store_word(v.manifest_of(r, p.set, v.team.rank) + j, core::stamped(stamp, bits));
  }
  return true;
}

// Dynamic shared memory of the send step: my experts [T][K] (int16, -1 for none or an invalid id),
// then (the counting CTA) int32 counts [E].
__host__ __device__ inline std::size_t experts_table_bytes(int num_tokens, int topk) {
  return (std::size_t(num_tokens) * topk * sizeof(int16_t) + 15) / 16 * 16;
}

// `masked`: the CTA's view of the mask, set here (the receive step of the same launch reads it too).
// Returns the call's sequence number (begin_call).
template <bool kFp8>
__device__ uint64_t send(const DispatchParams& p, bool* masked) {
  extern __shared__ int4 send_shared[];
  int16_t* experts = reinterpret_cast<int16_t*>(send_shared);
  int32_t* counts =
      reinterpret_cast<int32_t*>(reinterpret_cast<char*>(send_shared) + experts_table_bytes(p.num_tokens, p.topk));
  const LlView& v = p.v;
  // Work: T routing items (a token's headers and home record), then the send items (token, 8 lines of
  // its row), dealt to the warps in turn. With the default grid every warp has one or two, and the
  // routing items land on the first warps: where the work does not exceed the warps (FP8 at T = 128 on
  // 132 SMs) those have no lines to send, so the headers, which every receive of a message waits for,
  // do not queue behind lines; else the first warps take a send item after their routing item. (Routing
  // as the first of a token's items, before its lines, left them last: their warps' stores went out
  // ~3 us after the others'.) Where the work fits in one warp per CTA (FP8 at H = 7168 on 132 SMs: T <= 14),
  // item i goes to warp 0 of CTA i instead (first_work_item): a cast and its CTA's staging barrier then
  // wait for no other item (T = 1, 2026-11-23: FP8 12.7 -> 11.9 us). A warp's first work is loaded (a
  // send item: and cast) before the table is staged, with the peers' freed flags; a first send item's
  // row loads go out before anything else the kernel loads (its sequence number included): after the
  // ~330 instructions of start-up they went out ~1.1 us in (phase trace at EP=1, 2026-11-29).
  const int routing = p.num_tokens, work = send_work(p);
  const int warps = gridDim.x * kWarps, first = first_work_item(work, int(blockIdx.x), 0, kWarps);
  const bool first_sends = first >= routing && first < work;
  const auto [first_t, first_g] = p.by_row_items.split(uint32_t(max(first - routing, 0)));
  const ItemLoads<kFp8> first_loads = first_sends ? load_item<kFp8>(p, int(first_t), int(first_g)) : ItemLoads<kFp8>{};
  const uint64_t seq = begin_call(v, core::kLlDispatch, p.set);
  SetFree free = load_set_free(v, core::kLlDispatch, p.set);
  // The table's first entries (kEarlyEntries per thread) and the rank mask are loaded before the warp's
  // first work, so that their round trips overlap its loads instead of following them (kThreads >=
  // kMaxNvlinkRanks: one rank per thread).
  const int entries = p.num_tokens * p.topk;
  const auto entry = [&](int i) {  // entry i of the caller's table, flattened (token i / K, slot i % K)
    const auto [t, k] = p.by_topk.split(uint32_t(i));
    return topk_at(p.topk_idx, p.topk_int64, p.topk_row_stride, int(t), int(k));
  };
  // This thread's entries from `from` on, every blockDim.x-th, as many as `batch` holds: loaded together,
  // then staged (stage_batch).
  const auto load_batch = [&](int from, auto& batch) {
#pragma unroll
    for (int j = 0; j < int(sizeof(batch) / sizeof(batch[0])); ++j) {
      const int i = from + j * blockDim.x;
      batch[j] = i < entries ? entry(i) : -1;
    }
  };
  int64_t early[kEarlyEntries];
  load_batch(int(threadIdx.x), early);
  const bool rank_masked = int(threadIdx.x) < v.team.nranks && is_masked(v, threadIdx.x);
  uint32_t weight = first < routing ? load_weight(p, first) : 0u;
  uint4 vectors[2] = {};
  if (first_sends) {
    finish_item<kFp8>(p, seq, int(first_g), first_loads, vectors);
    if (threadIdx.x % kWarp == 0) transport::trace<transport::TracePoint::ll_dispatch_loaded>(v.team);
  }
  // Every CTA stages my top-k table once; CTA 0 records the first invalid id. Experts of masked ranks
  // become -1 in a second pass (only when a rank is masked).
  const auto stage_batch = [&](int from, const auto& batch) {
#pragma unroll
    for (int j = 0; j < int(sizeof(batch) / sizeof(batch[0])); ++j) {
      const int i = from + j * blockDim.x;
      if (i < entries) experts[i] = checked_expert(p, batch[j], i, blockIdx.x == 0);
    }
  };
  stage_batch(int(threadIdx.x), early);
  // The rest (T > 128 at K = 8) in batches too: one at a time, each load waited for the stage before it
  // (whose error path stores to global memory), 14 round trips a thread at T = 1024.
  for (int from = threadIdx.x + kEarlyEntries * blockDim.x; from < entries; from += kStagedBatch * blockDim.x) {
    int64_t batch[kStagedBatch];
    load_batch(from, batch);
    stage_batch(from, batch);
  }
  if (int(threadIdx.x) < v.team.nranks) masked[threadIdx.x] = rank_masked;
  // Its barrier also publishes the table and the mask (which the receive step of a launch with both
  // steps reads with no barrier of its own: every thread of every CTA passes this one).
  if (__syncthreads_or(rank_masked)) {
    for (int i = threadIdx.x; i < entries; i += blockDim.x) {
      if (experts[i] >= 0 && masked[v.by_local_experts.quotient(uint32_t(experts[i]))]) experts[i] = -1;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) transport::trace<transport::TracePoint::ll_dispatch_staged>(v.team);
  const bool counting = blockIdx.x == gridDim.x - 1;
  bool ok = !counting || send_counts_and_manifests(p, experts, masked, counts, seq, free);
  if (counting && threadIdx.x % kWarp == 0) transport::trace<transport::TracePoint::ll_dispatch_counts_sent>(v.team);
  bool sent_lines = false;  // for the phase trace
  for (int i = first; ok && i < work; i += warps) {
    if (i < routing) {
      if (i != first) weight = load_weight(p, i);
      ok = send_routing(p, experts, seq, i, weight, free);
      continue;
    }
    const auto [t, g] = p.by_row_items.split(uint32_t(i - routing));
    if (i != first) finish_item<kFp8>(p, seq, int(g), load_item<kFp8>(p, int(t), int(g)), vectors);
    ok = send_item<kFp8>(p, experts, seq, int(t), int(g), vectors, free);
    sent_lines = ok;
  }
  if (sent_lines && threadIdx.x % kWarp == 0) transport::trace<transport::TracePoint::ll_dispatch_sent>(v.team);
  return seq;
}

}  // namespace
}  // namespace epx::kernels::ll
