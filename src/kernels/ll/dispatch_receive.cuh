// The LL dispatch's receive step (its protocol: dispatch.cu). Included by dispatch.cu only.
#pragma once

#include <cstdint>

#include "kernels/ll/dispatch_shared.cuh"
#include "transport/device/phase_trace.hpp"
#include "transport/device/wait.cuh"

namespace epx::kernels::ll {
namespace {

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
// header, awaited together, and for each slot the count of its expert on every unmasked source whose
// block comes before s's (block_source), to find its row (see the protocol). `masked`: the CTA's view of the mask.
// `failed`: the team failed (on every lane).
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
    // The counts of up to kCountLoads sources before s (block_source) are loaded at once, then settled.
    constexpr int kCountLoads = 4;
    const int R = v.team.nranks, position = block_position(s, me, R);
    int32_t begin = 0;
    for (int first = 0; ok && first < position; first += kCountLoads) {
      LlWord count[kCountLoads];
#pragma unroll
      for (int i = 0; i < kCountLoads; ++i) {
        const int r = block_source(first + i, me, R);
        count[i] = first + i < position && !masked[r] ? load_word(v.expert_counts_of(me, p.set, r) + e) : 0;
      }
#pragma unroll
      for (int i = 0; i < kCountLoads; ++i) {
        const int r = block_source(first + i, me, R);
        if (first + i >= position || masked[r]) continue;
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

// Where this lane's vectors of a batch of line instructions (base .. batch_end - 1), loaded into x, go in a
// packed output row, worked out once per batch for every row the message expands to (the copy then costs
// each row a few predicated stores: a warp runs its instructions one after another, so per-row work adds
// up). A data vector: which of the batch's instructions give this lane one to store (`data`), and its byte
// in the row for instruction `base` (line_byte; each instruction's lines are kInstructionVectors vectors
// further, so the stores take their offsets as constants). FP8: the stamp vector of line 8 i + j carries
// the scale of group 7 i + j in its word 1 (j < 7); lane l < 4 kLineBatch takes the scale of the batch's
// line l (instruction base + l / 4, the stamp lane 8 (l % 4) + 7), so a row's scales go out in one store:
// its byte in the row's scales output (-1: none) and what goes there (UE8M0: the exponent byte, in byte
// group % 4 of word group / 4).
template <bool kFp8>
struct BatchTargets {
  static constexpr int kInstructionVectors = kLinesPerInstruction * kDataVectors;  // a row's 16-byte vectors
  static_assert(kDataVectors * sizeof(uint4) == core::kLlLineDataBytes, "line_byte: a line's data bytes");
  static_assert(kLinesPerInstruction * kLineBatch <= kWarp, "a lane for each line's scale");
  int32_t first_byte;
  uint32_t data;  // bit b: instruction base + b has a data vector of the row for this lane
  int64_t scale_at;
  uint32_t scale;

  __device__ BatchTargets(const DispatchParams& p, int base, int batch_end, int lines, const uint4 (&x)[kLineBatch]) {
    const int vector = line_vector(), lane = threadIdx.x % kWarp, bytes = row_bytes<kFp8>(p);
    first_byte = line_byte(instruction_line(base));
    data = 0u;
#pragma unroll
    for (int b = 0; b < kLineBatch; ++b) {
      const bool wanted = instruction_has_line(base + b, batch_end, lines);
      data |= uint32_t(wanted && vector < kDataVectors && line_byte(instruction_line(base + b)) < bytes) << b;
    }
    scale_at = -1;
    scale = 0u;
    if (!kFp8) return;
    const int b = lane / kLinesPerInstruction, line = kLinesPerInstruction * base + lane;
    const int k = line % kLinesPerItem, group = kItemGroups * (line / kLinesPerItem) + k;
#pragma unroll
    for (int i = 0; i < kLineBatch; ++i) {
      const uint32_t word =
          __shfl_sync(~0u, x[i].y, core::kLlLineVectors * (lane % kLinesPerInstruction) + kDataVectors);
      if (i == b) scale = word;
    }
    if (b < kLineBatch && base + b < batch_end && line < lines && k < kItemGroups && group < p.hidden / kGroup) {
      const int64_t col_bytes = p.scales_layout.col_stride * int64_t(sizeof(uint32_t));
      scale_at = p.ue8m0 ? (group / 4) * col_bytes + group % 4 : group * col_bytes;
    }
  }

  // This lane's vectors x into packed row `row`, whose scales output starts at `scales` (FP8).
  __device__ void store(const DispatchParams& p, int32_t row, uint8_t* scales, const uint4 (&x)[kLineBatch]) const {
    uint4* at = reinterpret_cast<uint4*>(static_cast<char*>(p.out_x) + int64_t(row) * row_bytes<kFp8>(p) + first_byte);
#pragma unroll
    for (int b = 0; b < kLineBatch; ++b) {
      if ((data >> b) & 1u) at[b * kInstructionVectors] = x[b];
    }
    if (!kFp8 || scale_at < 0) return;
    if (p.ue8m0) {
      scales[scale_at] = uint8_t(scale >> 23);
    } else {
      *reinterpret_cast<uint32_t*>(scales + scale_at) = scale;
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
  issue_lines(payload, first, min(end, first + kLineBatch), lines, x);  // checked after the routing's wait
  bool failed = false;
  const MessageRows m = message_rows<kFp8>(p, masked, stamp, s, t, failed);
  if (failed) return false;
  bool here = lines_carry(x, first, min(end, first + kLineBatch), lines, stamp);
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
    if (lane == 0) transport::trace<transport::TracePoint::ll_dispatch_lines>(v.team);
    const BatchTargets<kFp8> targets(p, base, batch_end, lines, x);
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
  // Every thread of the CTA has passed a barrier since it read the sequence (this one, or the send
  // step's staging).
  FreedRecord record{core::kLlDispatch};
  record.count(v);
  bool ok = true;
  if (blockIdx.x == gridDim.x - 1) {  // the per-expert outputs
    for (int e = threadIdx.x; ok && e < v.experts_per_rank(); e += blockDim.x) {
      int32_t begin = 0;
      for (int position = 0; ok && position < R; ++position) {
        const int s = block_source(position, me, R);
        LlWord count = 0;
        const PeerWait c =
            masked[s] ? PeerWait::masked : settle_word(v, s, stamp, v.expert_counts_of(me, p.set, s) + e, count, e);
        ok = c != PeerWait::failed;
        const int32_t n = c == PeerWait::arrived ? int32_t(core::stamped_value(count)) : 0;
        p.layout_range[e * R + s] = LlRange{.count = n, .begin = begin};
        begin += n;
      }
      p.recv_count[e] = begin;
      if (ok && p.cumulative_recv_count != nullptr) p.cumulative_recv_count[e] += begin;
    }
    ok = __syncthreads_and(ok);  // warp-uniform again: the work items use warp collectives
    if (threadIdx.x == 0) transport::trace<transport::TracePoint::ll_dispatch_outputs>(v.team);
  }
  // Work items: (message, part), p.by_receive_parts.d parts per message (receive_parts), my own messages
  // first (message m from source (me + m / T) % R). In a launch with the sends, the CTAs none of whose
  // warps has a send item ([idle, grid): first_idle_cta) take the first items, so my own messages go to
  // SMs that store nothing over NVLink: their lines, headers and counts are written early (the peers'
  // counts first of all), while on an SM that stores over NVLink every load waits behind those stores
  // until they drain at the link's pace, ~6.5 us in at T = 128 (FP8), when the peers' lines land anyway
  // (phase trace, 2026-11-29: own messages on such SMs ended the call). Within each class of CTAs ([idle,
  // grid), then [0, idle)) items are dealt over the CTAs first, from their last warps down (the send step's
  // items fill the CTAs from their first warps): a part's copy into its rows goes at the pace of its SM's
  // issue slots, so 16 items a CTA on half the SMs cost the dispatch FP8 0.8 us at EP = 1 (2026-11-29). The
  // last CTA's items wait behind the per-expert outputs above.
  const int messages = R * v.max_tokens, parts = int(p.by_receive_parts.d);
  const int grid = int(gridDim.x), warps = grid * kWarps, warp = int(threadIdx.x / kWarp), cta = int(blockIdx.x);
  const int idle = p.phases & kSend ? first_idle_cta(send_work(p), kWarps) : 0, idle_ctas = grid - idle;
  const int first = cta >= idle ? (kWarps - 1 - warp) * idle_ctas + cta - idle
                                : kWarps * idle_ctas + (kWarps - 1 - warp) * idle + cta;
  for (int item = first; ok && item < messages * parts; item += warps) {
    const auto [message, part] = p.by_receive_parts.split(uint32_t(item));
    const int k = int(v.by_max_tokens.quotient(message)), s = me + k < R ? me + k : me + k - R;
    ok = receive_message<kFp8>(p, masked, stamp, s, int(message) - k * v.max_tokens, int(part));
    if (threadIdx.x % kWarp == 0) transport::trace<transport::TracePoint::ll_dispatch_received>(v.team);
  }
  record.record_if_last(v, p.set, seq);
}

}  // namespace
}  // namespace epx::kernels::ll
