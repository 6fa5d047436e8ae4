// LL dispatch: one dedup message per (token, destination rank), written straight into the
// destination's receive area; each receiver then expands the messages into the caller's packed layout.
//
// Protocol, for buffer set `set` (areas of core::LlAreas; the sequence number seq and the "set is free"
// wait as in protocol.cuh). Everything a source writes into a destination's areas carries the call's
// stamp ll_stamp(seq): the routing as stamped words (core::LlWord), the payloads as lines
// (core::kLlLineBytes, a warp's store instruction writing 4 whole lines), so a receiver takes each word
// or line once it carries this call's stamp: there is no "ready" flag, no fence and no count before the
// receive can start.
//   Send (rank me). Every CTA first stages my top-k table in shared memory (int16, -1 for none, an
//   invalid id or an expert of a masked rank; CTA 0 records the first invalid id). A warp waits until the
//   peers have freed the set before its first remote store.
//     * Counts and manifests (the last CTA, before its items): expert_counts(r, set, me) = my tokens
//       per local expert of r; manifest(r, set, me) word j, bit i: my token 32 j + i sends r a
//       message (every word, for every rank r not masked).
//     * Routing items (a warp per token t): header(r, set, me, t) for every destination rank r of t:
//       slots, unique_slots, and per slot the expert, weight and block_row (how many of my tokens
//       before t name that expert: t's place among them); and home(set, t) (t's destination ranks
//       ascending and valid slots, for combine).
//     * Send items (a warp per token t and 8 lines of its row): payload(r, set, me, t) = the row as
//       lines (BF16, or FP8 cast once here with its group scales in the stamp vectors) for every
//       destination rank r of t.
//     All of them plain volatile stores over NVLink (8-byte words, 16-byte line vectors), in no order.
//   Receive (rank me). A source masked in the CTA's view of the mask (taken when the send step starts in a
//   launch with both steps, else when the receive step starts; a masked source counts as having sent nothing,
//   see protocol.cuh) is not read. Warps take (message, part of its payload) work items. Message (s, t): the
//   warp waits for manifest word t / 32 of s and, if t's bit is set (else t sent me nothing), the header's
//   words, in one wait; then for the counts expert_counts(me, set, s')[e] of each of its slots' experts e and
//   every unmasked s' < s: expert e's rows are source ranks ascending, tokens ascending, so the message goes
//   to row begin(e, s) + block_row of every unique slot naming e, begin(e, s) being the sum of those counts.
//   Then it waits for the payload lines of its part, and stores the part into every row (FP8: the scales
//   too); src_idx too. The part's loads (manifest word, header, first payload lines) all go out before the
//   first wait: a word or line loaded early vouches for itself as well.
//   The last CTA writes layout_range, recv_count and the statistics (waiting for every source's counts;
//   receive items go to CTAs in order, so the last one has the fewest and none waits behind it; in a
//   launch with the sends it has sent the counts and manifests first). What combine needs of each
//   message (slots, each slot's packed row and weight; slots 0 for a token that sent nothing) is kept in
//   private memory, so the set is not read after this step. Then the last CTA records the call as freed;
//   the signals go out at the start of this rank's next dispatch (protocol.cuh). Every wait is bounded
//   (wait_for_words).
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "core/cuda_check.hpp"
#include "kernels/common/grid.cuh"
#include "kernels/common/topk.cuh"
#include "kernels/ll/ll_view.hpp"
#include "kernels/ll/protocol.cuh"
#include "transport/device/phase_trace.hpp"
#include "transport/device/wait.cuh"

namespace epx::kernels::ll {
namespace {

constexpr int kThreads = 512;
static_assert(kThreads >= kMaxNvlinkRanks, "send() loads one rank's mask per thread");
constexpr int kWarps = kThreads / kWarp;
constexpr int kGroup = 128;  // columns per FP8 scale
// A send item is 8 lines of one token's row (protocol.cuh's items): for FP8, 7 whole scale groups.
constexpr int kItemGroups = kLinesPerItem * core::kLlLineDataBytes / kGroup;
static_assert(kItemGroups * kGroup == kLinesPerItem * core::kLlLineDataBytes, "an item holds whole FP8 groups");
constexpr int kLineBatch = 4;     // line instructions (16 lines) each receiving warp loads before it stores
constexpr int kEarlyEntries = 2;  // top-k entries each thread loads before its warp's first work (send)
constexpr float kAmaxFloor = 1e-4f;
constexpr float kE4m3Max = 448.0f;

using core::LlHomeToken;
using core::LlWord;

// ---- Send ----

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
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(w[i] << 16);
    out[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
  }
}

// The largest magnitude of 8 BF16 columns (a NaN counts as 0, as fmaxf has it).
__device__ float amax_of(const uint4& raw) {
  float f[8];
  unpack_bf16(raw, f);
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(f[i]));
  return amax;
}

// 8 BF16 columns as FP8 E4M3 (8 bytes), multiplied by inv = 1 / scale.
__device__ uint2 to_fp8(const uint4& raw, float inv) {
  float f[8];
  unpack_bf16(raw, f);
  uint32_t words[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    uint32_t word = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const uint32_t q = __nv_cvt_float_to_fp8(__fmul_rn(f[4 * i + b], inv), __NV_SATFINITE, __NV_E4M3);
      word |= q << (8 * b);
    }
    words[i] = word;
  }
  return make_uint2(words[0], words[1]);
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

// The call's rows as lines: FP8 H bytes, or BF16 2 H (send items of kLinesPerItem lines: by_row_items).
template <bool kFp8>
__device__ int row_bytes(const DispatchParams& p) {
  return kFp8 ? p.hidden : 2 * p.hidden;
}
template <bool kFp8>
__device__ int row_lines(const DispatchParams& p) {
  return core::ll_row_lines(row_bytes<kFp8>(p));
}

// One warp: this lane's vectors of item g of token t's row as they go on the wire (the stamp vectors
// included). FP8: the lanes of a group reduce its amax in shared memory (a group spans lanes of both
// instructions), and line 8 g + j's stamp vector carries group 7 g + j's scale (j < 7). Needs no
// routing, so a warp does it for its first item before the top-k table is staged.
template <bool kFp8>
__device__ void load_item(const DispatchParams& p, uint32_t stamp, int t, int g, uint4 (&x)[2]) {
  const int vector = line_vector(), bytes = row_bytes<kFp8>(p);
  const uint16_t* row = p.x + t * p.x_row_stride;
  int line[2], byte[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    line[j] = item_line(g, j);
    byte[j] = vector < kDataVectors ? line_byte(line[j]) : bytes;  // the stamp lane loads nothing
  }
  if (!kFp8) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      x[j] = vector == kDataVectors ? make_uint4(stamp, 0u, 0u, 0u)
             : byte[j] < bytes      ? *reinterpret_cast<const uint4*>(row + byte[j] / 2)
                                    : make_uint4(0u, 0u, 0u, 0u);
    }
    return;
  }
  // FP8: this lane's 16 columns (byte = column) as two vectors of 8 BF16 columns each.
  __shared__ uint32_t group_amax[kWarps][kItemGroups];  // float bits (>= 0: they order as the floats)
  uint32_t* amax = group_amax[threadIdx.x / kWarp];
  uint4 raw[2][2] = {};
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    if (byte[j] >= bytes) continue;
    raw[j][0] = *reinterpret_cast<const uint4*>(row + byte[j]);
    raw[j][1] = *reinterpret_cast<const uint4*>(row + byte[j] + 8);
  }
  const int lane = threadIdx.x % kWarp, item_byte = kLinesPerItem * core::kLlLineDataBytes * g;
  if (lane < kItemGroups) amax[lane] = 0u;
  __syncwarp();
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    if (byte[j] < bytes)
      atomicMax(&amax[(byte[j] - item_byte) / kGroup], __float_as_uint(fmaxf(amax_of(raw[j][0]), amax_of(raw[j][1]))));
  }
  __syncwarp();
  const int groups = p.hidden / kGroup;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    if (vector == kDataVectors) {
      const int k = line[j] % kLinesPerItem, group = kItemGroups * g + k;
      const bool carries = k < kItemGroups && group < groups;
      const float scale = carries ? fp8_scale(__uint_as_float(amax[k]), p.round_scale) : 0.0f;
      x[j] = make_uint4(stamp, __float_as_uint(scale), 0u, 0u);
    } else if (byte[j] < bytes) {
      const float scale = fp8_scale(__uint_as_float(amax[(byte[j] - item_byte) / kGroup]), p.round_scale);
      const float inv = 1.0f / scale;
      const uint2 lo = to_fp8(raw[j][0], inv), hi = to_fp8(raw[j][1], inv);
      x[j] = make_uint4(lo.x, lo.y, hi.x, hi.y);
    } else {
      x[j] = make_uint4(0u, 0u, 0u, 0u);
    }
  }
  __syncwarp();  // every lane has read the amax before the warp's next item resets it
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
template <bool kFp8>
__device__ void send(const DispatchParams& p, uint64_t seq, bool* masked) {
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
  // send item: and cast) before the table is staged, with the peers' freed flags.
  const uint32_t stamp = core::ll_stamp(seq);
  const int per_row = int(p.by_row_items.d), routing = p.num_tokens, work = routing + p.num_tokens * per_row;
  const int warps = gridDim.x * kWarps, first = first_work_item(work, int(blockIdx.x), 0, kWarps);
  SetFree free = load_set_free(v, core::kLlDispatch, p.set);
  // The table's first entries (kEarlyEntries per thread) and the rank mask are loaded before the warp's
  // first work, so that their round trips overlap its loads instead of following them (kThreads >=
  // kMaxNvlinkRanks: one rank per thread).
  const int entries = p.num_tokens * p.topk;
  const auto entry = [&](int i) {  // entry i of the caller's table, flattened (token i / K, slot i % K)
    const auto [t, k] = p.by_topk.split(uint32_t(i));
    return topk_at(p.topk_idx, p.topk_int64, p.topk_row_stride, int(t), int(k));
  };
  int64_t early[kEarlyEntries];
#pragma unroll
  for (int j = 0; j < kEarlyEntries; ++j) {
    const int i = threadIdx.x + j * blockDim.x;
    early[j] = i < entries ? entry(i) : -1;
  }
  const bool rank_masked = int(threadIdx.x) < v.team.nranks && is_masked(v, threadIdx.x);
  uint32_t weight = first < routing ? load_weight(p, first) : 0u;
  uint4 vectors[2] = {};
  if (first >= routing && first < work) {
    const auto [t, g] = p.by_row_items.split(uint32_t(first - routing));
    load_item<kFp8>(p, stamp, int(t), int(g), vectors);
    if (threadIdx.x % kWarp == 0) transport::trace<transport::TracePoint::ll_dispatch_loaded>(v.team);
  }
  // Every CTA stages my top-k table once; CTA 0 records the first invalid id. Experts of masked ranks
  // become -1 in a second pass (only when a rank is masked).
  const auto stage = [&](int i, int64_t e) { experts[i] = checked_expert(p, e, i, blockIdx.x == 0); };
#pragma unroll
  for (int j = 0; j < kEarlyEntries; ++j) {
    const int i = threadIdx.x + j * blockDim.x;
    if (i < entries) stage(i, early[j]);
  }
  for (int i = threadIdx.x + kEarlyEntries * blockDim.x; i < entries; i += blockDim.x) stage(i, entry(i));
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
    if (i != first) load_item<kFp8>(p, stamp, int(t), int(g), vectors);
    ok = send_item<kFp8>(p, experts, seq, int(t), int(g), vectors, free);
    sent_lines = ok;
  }
  if (sent_lines && threadIdx.x % kWarp == 0) transport::trace<transport::TracePoint::ll_dispatch_sent>(v.team);
}

// ---- Receive ----

// One message's routing as lane k of a warp sees it (slot k): the packed row it expands to.
struct MessageRows {
  uint32_t slots;               // the message's slots (0: no message from this token this time)
  uint32_t weights_at_combine;  // core::kLlWeightsAtCombine if the source's combine brings the weights, else 0
  uint32_t unique_slots;        // those that get a row of their own
  int32_t row;                  // lane k: packed row e * C + i of slot k (valid where slots has bit k)
  float weight;                 // lane k: slot k's weight
  uint32_t* scales;             // lane k, FP8: the scales output of row (e, i) (column 0)
};

// Waits (wait_for_words) until `word`, a load of *at made earlier (0: none yet), carries the call's
// stamp, loading *at again while it does not. Returns the wait's outcome on this lane.
__device__ PeerWait settle_word(const LlView& v, int s, uint32_t stamp, const LlWord* at, LlWord& word, int detail) {
  return wait_for_words(
      v, s, stamp,
      [&] {
        if (!core::stamped_in(word, stamp)) word = load_word(at);
        return core::stamped_in(word, stamp);
      },
      [&] { return word; }, transport::WaitSite{transport::WaitPhase::ll_dispatch_recv, s, uint32_t(detail)});
}

// The whole warp reads message (s, t)'s routing: whether t sent me a message (its manifest bit) and its
// header, awaited together, and for each slot the count of its expert on every unmasked source before
// s, to find its row (see the protocol). `masked`: the CTA's view of the mask. `failed`: the team failed
// (on every lane).
template <bool kFp8>
__device__ MessageRows message_rows(const DispatchParams& p, const bool* masked, uint32_t stamp, int s, int t,
                                    bool& failed) {
  using namespace core;
  const LlView& v = p.v;
  const int lane = threadIdx.x % kWarp, me = v.team.rank;
  MessageRows m{0u, 0u, 0u, -1, 0.0f, nullptr};
  failed = false;
  if (masked[s]) return m;
  // The manifest word and the header are loaded together and awaited together (the header only counts
  // once the manifest bit says the message exists): one whole-warp wait whose polls reload what has not
  // arrived, until the manifest word has (lane 0's load decides) and, if t's bit is set, every header
  // word too; so a header that lands while the manifest word is awaited costs no round trip of its own.
  // Lane w holds header word w, and lanes below kLlHeaderWords - 32 word 32 + w too.
  const LlWord* manifest_at = v.manifest_of(me, p.set, s) + t / kWarp;
  const LlWord* header = v.header(me, p.set, s, t);
  const bool second = lane < kLlHeaderWords - kWarp;
  LlWord manifest = load_word(manifest_at);
  LlWord words[2] = {load_word(header + lane), second ? load_word(header + kWarp + lane) : 0};
  const auto header_missing = [&] {
    return __ballot_sync(~0u, !stamped_in(words[0], stamp) || (second && !stamped_in(words[1], stamp)));
  };
  const auto sends_me = [&] { return ((stamped_value(manifest) >> (t % kWarp)) & 1u) != 0u; };
  const PeerWait got = wait_for_words<true>(
      v, s, stamp,
      [&] {
        if (!stamped_in(manifest, stamp)) manifest = load_word(manifest_at);
        if (!stamped_in(words[0], stamp)) words[0] = load_word(header + lane);
        if (second && !stamped_in(words[1], stamp)) words[1] = load_word(header + kWarp + lane);
        manifest = __shfl_sync(~0u, manifest, 0);
        const uint32_t missing = header_missing();
        return stamped_in(manifest, stamp) && (!sends_me() || missing == 0u);
      },
      [&] {  // for a report: the manifest word, or else the first header word missing
        const uint32_t missing = header_missing();
        if (!stamped_in(manifest, stamp) || missing == 0u) return manifest;
        const int w = __ffs(missing) - 1;
        const LlWord first = __shfl_sync(~0u, words[0], w), above = __shfl_sync(~0u, words[1], w);
        return stamped_in(first, stamp) ? above : first;
      },
      transport::WaitSite{transport::WaitPhase::ll_dispatch_recv, s, uint32_t(t)});
  if (lane == 0) transport::trace<transport::TracePoint::ll_dispatch_manifest>(v.team);
  failed = got == PeerWait::failed;
  if (got != PeerWait::arrived || !sends_me()) return m;
  if (lane == 0) transport::trace<transport::TracePoint::ll_dispatch_header>(v.team);
  const int k = lane % kLlMaxTopk;
  const uint32_t slots_word = __shfl_sync(~0u, core::stamped_value(words[0]), kLlHeaderSlots);
  const uint32_t slots = slots_word & kLlSlotBits;
  const uint32_t unique_slots = __shfl_sync(~0u, core::stamped_value(words[0]), kLlHeaderUniqueSlots);
  const uint32_t expert_pair = __shfl_sync(~0u, core::stamped_value(words[0]), kLlHeaderExperts + k / 2);
  const uint32_t row_pair = __shfl_sync(~0u, core::stamped_value(words[0]), kLlHeaderBlockRows + k / 2);
  const uint32_t weight_here = __shfl_sync(~0u, core::stamped_value(words[0]), (kLlHeaderWeights + k) & (kWarp - 1));
  const uint32_t weight_above = __shfl_sync(~0u, core::stamped_value(words[1]), (kLlHeaderWeights + k) & (kWarp - 1));
  const int e = int16_t(expert_pair >> (16 * (k % 2)));
  const int block_row = int16_t(row_pair >> (16 * (k % 2)));
  const float weight = __uint_as_float(kLlHeaderWeights + k < kWarp ? weight_here : weight_above);
  m.slots = slots;
  m.weights_at_combine = slots_word & kLlWeightsAtCombine;
  m.unique_slots = unique_slots;
  bool ok = true;
  if ((slots >> lane) & 1u) {
    // The counts of up to kCountLoads earlier sources are loaded at once, then settled.
    constexpr int kCountLoads = 4;
    int32_t begin = 0;
    for (int first = 0; ok && first < s; first += kCountLoads) {
      LlWord count[kCountLoads];
#pragma unroll
      for (int i = 0; i < kCountLoads; ++i) {
        const int r = first + i;
        count[i] = r < s && !masked[r] ? load_word(v.expert_counts_of(me, p.set, r) + e) : 0;
      }
#pragma unroll
      for (int i = 0; i < kCountLoads; ++i) {
        const int r = first + i;
        if (r >= s || masked[r]) continue;
        const PeerWait c = settle_word(v, r, stamp, v.expert_counts_of(me, p.set, r) + e, count[i], e);
        ok = ok && c != PeerWait::failed;
        if (c == PeerWait::arrived) begin += int32_t(core::stamped_value(count[i]));
      }
    }
    const int32_t i = begin + block_row;
    const LlScalesLayout& l = p.scales_layout;
    m.row = int32_t(e * v.rows_per_expert() + i);
    m.weight = weight;
    if (kFp8) m.scales = static_cast<uint32_t*>(p.out_scales) + e * l.expert_stride + i * l.row_stride;
  }
  failed = !__all_sync(~0u, ok);
  return m;
}

// Where this lane's vectors of a batch of line instructions (base .. batch_end - 1) go in a packed output
// row, worked out once per batch for every row the message expands to (the copy then costs each row a
// few predicated stores: a warp runs its instructions one after another, so per-row work adds up). A
// data vector: its byte in the row (-1: past the row, or no line). FP8, a stamp vector, whose word 1 is
// the scale of group 7 i + j of line 8 i + j (j < 7): its byte in the row's scales output (-1: none),
// and what goes there (UE8M0: the exponent byte, in byte group % 4 of word group / 4).
template <bool kFp8>
struct BatchTargets {
  int32_t data_at[kLineBatch];
  int64_t scale_at[kLineBatch];

  __device__ BatchTargets(const DispatchParams& p, int base, int batch_end, int lines) {
    const int vector = line_vector(), bytes = row_bytes<kFp8>(p), groups = p.hidden / kGroup;
    const int64_t col_bytes = p.scales_layout.col_stride * int64_t(sizeof(uint32_t));
#pragma unroll
    for (int b = 0; b < kLineBatch; ++b) {
      const int line = instruction_line(base + b);
      const bool wanted = base + b < batch_end && line < lines;
      const int byte = line_byte(line);
      data_at[b] = wanted && vector < kDataVectors && byte < bytes ? byte : -1;
      const int k = line % kLinesPerItem, group = kItemGroups * (line / kLinesPerItem) + k;
      const bool scale = kFp8 && wanted && vector == kDataVectors && k < kItemGroups && group < groups;
      scale_at[b] = !scale ? -1 : p.ue8m0 ? (group / 4) * col_bytes + group % 4 : group * col_bytes;
    }
  }

  // This lane's vectors x into packed row `row`, whose scales output starts at `scales` (FP8).
  __device__ void store(const DispatchParams& p, int32_t row, uint8_t* scales, const uint4 (&x)[kLineBatch]) const {
    char* out = static_cast<char*>(p.out_x) + int64_t(row) * row_bytes<kFp8>(p);
#pragma unroll
    for (int b = 0; b < kLineBatch; ++b) {
      if (data_at[b] >= 0) *reinterpret_cast<uint4*>(out + data_at[b]) = x[b];
      if (!kFp8 || scale_at[b] < 0) continue;
      if (p.ue8m0) {
        scales[scale_at[b]] = uint8_t(x[b].y >> 23);
      } else {
        *reinterpret_cast<uint32_t*>(scales + scale_at[b]) = x[b].y;
      }
    }
  }
};

// One warp, part `part` of message (s, t), of p.by_receive_parts.d parts: a run of its payload's line
// instructions (p.part_instructions, the last part what is left). Every load of the part goes out
// before any wait: the manifest word, the header and the first batch of its lines; a stamped word or
// line vouches for itself, so one loaded before the manifest bit was seen is as good as one loaded
// after. What had not arrived is then polled, in the protocol's order. Part 0 records the message for
// combine (message_slots, entry_rows, entry_weights) and src_idx; every part copies its lines into
// every row the message expands to. Returns false when the team failed.
template <bool kFp8>
__device__ bool receive_message(const DispatchParams& p, const bool* masked, uint32_t stamp, int s, int t, int part) {
  const LlView& v = p.v;
  const int lane = threadIdx.x % kWarp, me = v.team.rank;
  const uint4* payload = v.payload(me, p.set, s, t);
  const int lines = row_lines<kFp8>(p), instructions = line_instructions(lines);
  const int first = part * p.part_instructions, end = min(instructions, first + p.part_instructions);
  uint4 x[kLineBatch] = {};
  bool here = load_lines(payload, first, min(end, first + kLineBatch), lines, stamp, x);
  bool failed = false;
  const MessageRows m = message_rows<kFp8>(p, masked, stamp, s, t, failed);
  if (failed) return false;
  if (lane == 0) transport::trace<transport::TracePoint::ll_dispatch_routed>(v.team);
  if (part == 0) {
    if (lane == 0) *v.message_slots_of(p.set, s, t) = m.slots | m.weights_at_combine;
    if ((m.slots >> lane) & 1u) {
      v.entry_rows_of(p.set, s, t)[lane] = m.row;
      v.entry_weights_of(p.set, s, t)[lane] = m.weight;
      if ((m.unique_slots >> lane) & 1u) p.src_idx[m.row] = t;
    }
  }
  if (m.slots == 0u) return true;
  for (int base = first; base < end; base += kLineBatch) {
    const int batch_end = min(end, base + kLineBatch);
    if (base != first) here = load_lines(payload, base, batch_end, lines, stamp, x);
    const PeerWait got =
        here ? PeerWait::arrived
             : wait_for_lines(v, s, payload, base, batch_end, lines, stamp, x,
                              transport::WaitSite{transport::WaitPhase::ll_dispatch_recv, s, uint32_t(t)});
    if (got == PeerWait::failed) return false;
    if (got == PeerWait::masked) return true;  // s got masked: its rows stay unwritten
    const BatchTargets<kFp8> targets(p, base, batch_end, lines);
    for (uint32_t rest = m.unique_slots; rest != 0u; rest &= rest - 1u) {
      const int slot = __ffs(rest) - 1;
      uint8_t* scales = nullptr;
      if (kFp8) {
        scales = reinterpret_cast<uint8_t*>(__shfl_sync(~0u, reinterpret_cast<unsigned long long>(m.scales), slot));
      }
      targets.store(p, __shfl_sync(~0u, m.row, slot), scales, x);
    }
  }
  return true;
}

// `masked`: the CTA's view of the mask (protocol.cuh), set and published by the send step's staging when
// the launch ran it (so a warp goes on from its send items to its receive items with no load or barrier
// between), else here.
template <bool kFp8>
__device__ void receive(const DispatchParams& p, uint64_t seq, bool* masked) {
  const LlView& v = p.v;
  const int R = v.team.nranks, me = v.team.rank;
  const uint32_t stamp = core::ll_stamp(seq);
  if (!(p.phases & kSend)) {
    for (int r = threadIdx.x; r < R; r += blockDim.x) masked[r] = is_masked(v, r);
    __syncthreads();
  }
  bool ok = true;
  if (blockIdx.x == gridDim.x - 1) {  // the per-expert outputs
    for (int e = threadIdx.x; ok && e < v.experts_per_rank(); e += blockDim.x) {
      int32_t begin = 0;
      for (int s = 0; ok && s < R; ++s) {
        LlWord count = 0;
        const PeerWait c =
            masked[s] ? PeerWait::masked : settle_word(v, s, stamp, v.expert_counts_of(me, p.set, s) + e, count, e);
        ok = c != PeerWait::failed;
        const int32_t n = c == PeerWait::arrived ? int32_t(core::stamped_value(count)) : 0;
        p.layout_range[e * R + s] = LlRange{begin, n};
        begin += n;
      }
      p.recv_count[e] = begin;
      if (ok && p.cumulative_recv_count != nullptr) p.cumulative_recv_count[e] += begin;
    }
    ok = __syncthreads_and(ok);  // warp-uniform again: the work items use warp collectives
    if (threadIdx.x == 0) transport::trace<transport::TracePoint::ll_dispatch_outputs>(v.team);
  }
  // Work items: (message, part), p.by_receive_parts.d parts per message (receive_parts).
  const int messages = R * v.max_tokens, parts = int(p.by_receive_parts.d);
  const int warps = gridDim.x * kWarps;
  for (int item = blockIdx.x * kWarps + threadIdx.x / kWarp; ok && item < messages * parts; item += warps) {
    const auto [message, part] = p.by_receive_parts.split(uint32_t(item));
    const int s = int(v.by_max_tokens.quotient(message));
    ok = receive_message<kFp8>(p, masked, stamp, s, int(message) - s * v.max_tokens, int(part));
    if (threadIdx.x % kWarp == 0) transport::trace<transport::TracePoint::ll_dispatch_received>(v.team);
  }
  last_cta_records_freed(v, v.blocks_done_of(core::kLlDispatch), core::kLlDispatch, p.set, seq);
}

// kFp8: p.fp8, a kernel of its own for each payload format (with one kernel for both, the BF16 calls
// took ~0.5 us longer once the FP8 receive got cheaper, from the code the compiler made for the pair).
template <bool kFp8>
__global__ void __launch_bounds__(kThreads) dispatch_kernel(DispatchParams p) {
  if (threadIdx.x % kWarp == 0) transport::trace<transport::TracePoint::ll_dispatch_start>(p.v.team);
  // Not the last CTA (unless it is the only one): it sends the counts, which every receive waits for.
  if (int(blockIdx.x) == max(int(gridDim.x) - 2, 0) && threadIdx.x == 0) signal_pending_freed(p.v, core::kLlDispatch);
  const uint64_t seq = call_sequence(p.v, core::kLlDispatch, p.set);
  __shared__ bool masked[kMaxNvlinkRanks];  // the CTA's view of the mask: see send and receive
  if (p.phases & kSend) send<kFp8>(p, seq, masked);
  if (p.phases & kReceive) receive<kFp8>(p, seq, masked);
  if (threadIdx.x == 0) transport::trace<transport::TracePoint::ll_dispatch_end>(p.v.team);
}

}  // namespace

constexpr std::size_t kMaxSendShared =
    (std::size_t(core::kLlMaxTokens) * core::kLlMaxTopk * sizeof(int16_t)) + core::kLlMaxExperts * sizeof(int32_t);

void load_dispatch_kernel() {
  const auto load = [](const void* kernel, const char* what) {
    detail::allow_dynamic_shared_memory(kernel, int(kMaxSendShared), what);
    detail::load_kernel(kernel, what);
  };
  load(reinterpret_cast<const void*>(dispatch_kernel<true>), "LL dispatch kernel (FP8)");
  load(reinterpret_cast<const void*>(dispatch_kernel<false>), "LL dispatch kernel (BF16)");
}

// The parts a received message of `lines` lines is cut into: so that every warp of the grid has about one
// work item (at most 8, and no more than the payload's line instructions).
static int receive_parts(const DispatchParams& p, int lines, int num_blocks) {
  const int messages = p.v.team.nranks * p.v.max_tokens;
  return std::max(1, std::min(std::min(num_blocks * kWarps / messages, 8), line_instructions(lines)));
}

void launch_dispatch(const DispatchParams& params, int num_blocks, cudaStream_t stream) {
  DispatchParams p = params;
  p.by_topk = core::Divisor::of(uint32_t(std::max(p.topk, 1)));
  const int lines = core::ll_row_lines(p.fp8 ? p.hidden : 2 * p.hidden);  // as row_lines<kFp8> on the device
  p.by_row_items = core::Divisor::of(uint32_t(line_items(lines)));
  const int parts = receive_parts(p, lines, num_blocks);
  p.by_receive_parts = core::Divisor::of(uint32_t(parts));
  p.part_instructions = (line_instructions(lines) + parts - 1) / parts;
  const std::size_t shared = (p.phases & kSend) == 0 ? 0
                                                     : experts_table_bytes(p.num_tokens, p.topk) +
                                                           std::size_t(p.v.num_experts) * sizeof(int32_t);
  if (p.fp8) {
    dispatch_kernel<true><<<num_blocks, kThreads, shared, stream>>>(p);
  } else {
    dispatch_kernel<false><<<num_blocks, kThreads, shared, stream>>>(p);
  }
  detail::check_launch("LL dispatch kernel");
}

}  // namespace epx::kernels::ll
