// LL combine: the expert side sends each message's rows back to the token's home rank, reduced over
// its local experts (local order) or one per slot (naive order); the home rank adds them up.
//
// Protocol, for combine buffer set `set`, reversing the dispatch of set `dset` (areas of
// core::LlAreas; the sequence number and the "set is free" wait as in protocol.cuh). The rows travel as
// lines (core::kLlLineBytes: 7 vectors of the row's head and a stamp vector holding ll_stamp(cseq) and 12
// bytes of the row's rest, core::ll_combine_row_lines; a warp's store instruction writing 4 whole lines),
// so the home rank takes each line once its stamp shows: there is no "ready" flag, no fence and no count.
//   Weights (home me, local order, when my dispatch had none and this call was given them): first, per
//   token t, for each valid slot k whose expert is on a rank r other than me and not masked now,
//   word k of combine_weights(r, set, me, t) = the weight, stamped (core::LlWord), after the warp's
//   "set is free" wait (send_weights). My dispatch's headers told every r that they will come
//   (core::kLlWeightsAtCombine).
//   Send (expert side me): per message (s, t) that dispatch received (its private record: slots,
//   entry_rows, entry_weights) from a home rank s not masked now, split into items of 8 lines over
//   warps; a warp waits until every peer has freed `set` before its first remote store:
//     local: p = 0; for its slots k ascending: p = fmaf(weight_k, y[entry_rows_k], p); the BF16 of p
//            goes to combine_row(s, set, me, t) (a slot repeating an expert counts again, with its weight).
//            weight_k is the record's, or where the record says the weights come with combine, s's:
//            from p.weights if s = me, else word k of combine_weights(me, set, s, t), which the warp
//            waits for (bounded, wait_for_words) once its first y loads are issued; if s is masked
//            meanwhile, the message is dropped;
//     naive: y[entry_rows_k] goes to combine_row(s, set, k, t) for every slot k.
//   When the launch also runs the receive step (a call without send_only), the messages to me are not
//   sent: the receive takes my own rows from y directly, the same values (own_rows_direct); in local
//   order each warp reduces its first receive item's own rows before its sends (early_own_rows).
//   Receive (home me): per token t and item of 8 lines, a warp waits for the item's lines of each row it
//   adds (bounded, wait_for_words; a rank masked when the step starts is not read, one masked while
//   the warp waits is left out) and
//     out[t] = BF16 of: local: the sum of float(combine_row(me, set, r, t)) over t's ranks r ascending
//     (home(dset, t)); naive: fmaf(w[t][k], float(combine_row(me, set, k, t)), acc) over t's valid
//     slots k ascending. A token with no expert gets 0. With own_rows_direct the terms of r = me
//     (naive: of t's slots on me) come from y and the dispatch's private record of message (me, t)
//     (own_partial: the send's reduce), and wait for nothing; rows (me, set, me or k, t) are then not
//     written and keep an older call's stamp. The CTA that counts itself last when the step starts records the
//     call as freed (FreedRecord); the signals go out at the start of this rank's next combine (protocol.cuh).
#include <algorithm>

#include "core/cuda_check.hpp"
#include "kernels/common/bf16.cuh"
#include "kernels/common/grid.cuh"
#include "kernels/common/launch.hpp"
#include "kernels/ll/ll_view.hpp"
#include "kernels/ll/protocol.cuh"
#include "transport/device/phase_trace.hpp"
#include "transport/device/wait.cuh"

namespace epx::kernels::ll {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / kWarp;
constexpr int kColsPerVector = 8;  // 16 bytes of BF16
// Rows whose vectors a lane loads before it adds (send, own_partial). More would spill in the send; 8 in the
// early own rows alone, where registers are to spare, made the combine 0.6 us slower (2026-11-29).
constexpr int kRowsInFlight = 4;
constexpr int kReceiveRowsInFlight = 2;  // the same in the receive (4 would spill: 128 registers)

using core::LlHomeToken;

// ---- Send ----

// The call's rows: their lines (of p.hidden columns) and work items of kLinesPerItem lines.
__device__ int row_lines(const CombineParams& p) { return core::ll_combine_row_lines(2 * p.hidden); }
__device__ int row_items(const CombineParams& p) { return int(p.by_row_items.d); }

// A lane holds its values of an item's two line instructions in the row form (core::ll_combine_row_form_col):
// 8 columns as a 16-byte vector of the row each, so that every lane loads, adds and stores whole vectors of
// y and out with one instruction each. A data lane's vector is its line vector. The tail lanes (8 m + 7, the
// stamp vectors' lanes) hold the instruction's 48 rest bytes as three aligned vectors (m < 3; lane 31 none),
// and trade words with shuffles to and from the lines' form once per item and row sent or received
// (to_line_form, from_line_form). Until 2026-11-29 a tail lane held its line's 12 rest bytes and loaded y's and
// stored out's with three 4-byte instructions, which the warp issued beside the data lanes' vector ones.
__device__ bool tail_lane() { return line_vector() == kDataVectors; }

// This lane's first column in the row form of each line instruction of item g (p.hidden where it holds none).
__device__ void item_cols(const CombineParams& p, int g, int (&col)[2]) {
#pragma unroll
  for (int j = 0; j < 2; ++j)
    col[j] = core::ll_combine_row_form_col(p.hidden, row_lines(p), 2 * g + j, int(threadIdx.x % kWarp));
}

// The word of a row-form or line vector that a shuffle round gives (word `w`, a compile-time constant).
__device__ __forceinline__ uint32_t word_of(const uint4& x, int w) {
  return w == 0 ? x.x : w == 1 ? x.y : w == 2 ? x.z : x.w;
}

// The whole warp: its share of a line instruction's stamp vectors from the row form `x`, the stamp in word 0;
// a data lane's vector as it is. Tail lane m's words 1-3 carry the instruction's rest words 3 m .. 3 m + 2, and
// tail lane 8 q + 7 holds rest words 4 q .. 4 q + 3 as its words 0-3. In shuffle round r every lane gives its
// word r, and tail lane m takes rest word 3 m + i, i = (r + m) mod 4, from the lane holding it (there it is
// word (3 m + i) mod 4 = r); i = 3 is not its own. Each rest word moves once, in 4 shuffles.
__device__ uint4 to_line_form(const uint4& x, uint32_t stamp) {
  const int m = int(threadIdx.x % kWarp) / core::kLlLineVectors;
  uint32_t got[4];  // got[r]: rest word 3 m + (r + m) mod 4
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int q = (3 * m + ((r + m) & 3)) / 4;  // <= 3: a lane of the warp
    got[r] = __shfl_sync(~0u, word_of(x, r), q * core::kLlLineVectors + kDataVectors);
  }
  const auto word = [&](int i) {  // rest word 3 m + i: got[(i - m) mod 4]
    const int r = (i - m) & 3;
    return r == 0 ? got[0] : r == 1 ? got[1] : r == 2 ? got[2] : got[3];
  };
  return tail_lane() ? make_uint4(stamp, word(0), word(1), word(2)) : x;
}

// The whole warp: the row form of a line instruction as it arrived, `x` (to_line_form's inverse; lane 31
// gets zeros). Word k of tail lane 8 q + 7 is rest word 4 q + k, which tail lane m = q + (q + k) / 3 carries
// as word (q + k) mod 3 of its words 1-3. In shuffle round k every tail lane m gives its word (m + k) mod 4 of
// words 1-3, which for that taker is the word it wants ((m + k) mod 4 = (q + k) mod 3); 3: no one takes it.
__device__ uint4 from_line_form(const uint4& x) {
  const int group = int(threadIdx.x % kWarp) / core::kLlLineVectors;  // m as a giver, q as a taker
  uint32_t got[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int gives = (group + k) & 3;
    const uint32_t value = gives == 0 ? x.y : gives == 1 ? x.z : x.w;
    const int from = min(group + (group + k) / 3, 3);  // lane 31 (q = 3) keeps nothing it takes
    got[k] = __shfl_sync(~0u, value, from * core::kLlLineVectors + kDataVectors);
  }
  if (!tail_lane()) return x;
  return group < 3 ? make_uint4(got[0], got[1], got[2], got[3]) : make_uint4(0u, 0u, 0u, 0u);
}

// This lane's share of item g of `row` (`col` as item_cols gives it, `data` in the row form): a data
// vector (zeros past the row), or on tail lanes the stamp vector (its words past the row hold what the
// lanes' sums hold there, zeros unless a weight is not finite; no one reads them). The whole warp.
__device__ void store_item(const CombineParams& p, uint4* row, uint32_t stamp, int g, const int (&col)[2],
                           const uint4 (&data)[2]) {
  uint4 x[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const uint4 line = to_line_form(data[j], stamp);
    x[j] = tail_lane() || col[j] < p.hidden ? line : make_uint4(0u, 0u, 0u, 0u);
  }
  store_lines(row, 2 * g, row_lines(p), x);
}

// What dispatch recorded of message (s, t) (its private record): its slots, and lane k's slot k packed
// row and weight. Where the home rank s gives its weights to combine (local order; the record carries
// core::kLlWeightsAtCombine), the weight is the home rank's: mine from p.weights when I am s, else one
// to come in combine_weights (await_weights).
struct MessageRecord {
  uint32_t slots;
  int32_t row_of_slot;
  float weight_of_slot;
  bool weights_to_come;
};

// Whether this rank's weights come with its combine (local order: its dispatch had none).
__device__ bool weights_given_here(const CombineParams& p) { return !p.naive && p.weights != nullptr; }

__device__ MessageRecord load_record(const CombineParams& p, int s, int t) {
  const LlView& v = p.v;
  const int k = int(threadIdx.x % kWarp) % core::kLlMaxTopk;
  // My own message's flag is set exactly when my weights come here, so no load waits for the word.
  const bool mine = s == v.team.rank && weights_given_here(p);
  const bool in_record = k < v.max_topk;
  // The three loads go out before the word is used (no branch on it between them).
  const uint32_t word = *v.message_slots_of(p.dispatch_set, s, t);
  const int32_t row = in_record ? v.entry_rows_of(p.dispatch_set, s, t)[k] : 0;
  const float weight = !in_record   ? 0.0f
                       : !mine      ? v.entry_weights_of(p.dispatch_set, s, t)[k]
                       : k < p.topk ? p.weights[t * p.weights_row_stride + k]
                                    : 0.0f;
  // The same on every lane (await_weights is the whole warp's).
  const bool to_come = !p.naive && !mine && (word & core::kLlWeightsAtCombine) != 0u;
  return MessageRecord{word & core::kLlSlotBits, row, weight, to_come};
}

// Lane k's load of word k of the weights home rank s sends me for token t (a slot of the message whose
// weights are to come; else 0), issued before the warp's y loads so that the two round trips overlap.
__device__ core::LlWord load_weight_word(const CombineParams& p, int s, int t, const MessageRecord& m) {
  const int k = int(threadIdx.x % kWarp);
  const bool wanted = m.weights_to_come && k < core::kLlMaxTopk && ((m.slots >> k) & 1u);
  return wanted ? load_word(p.v.combine_weights_of(p.v.team.rank, p.set, s, t) + k) : 0u;
}

// The whole warp waits (wait_for_words) until lane k's `word` (load_weight_word), for each slot k of
// message (s, t), carries the call's stamp, reloading what has not; then takes the weights into m.
__device__ PeerWait await_weights(const CombineParams& p, int s, int t, uint32_t stamp, MessageRecord& m,
                                  core::LlWord& word) {
  const LlView& v = p.v;
  const int k = int(threadIdx.x % kWarp);
  const bool wanted = k < core::kLlMaxTopk && ((m.slots >> k) & 1u);
  const core::LlWord* at = v.combine_weights_of(v.team.rank, p.set, s, t) + k;
  const auto missing = [&] { return __ballot_sync(~0u, wanted && !core::stamped_in(word, stamp)); };
  const PeerWait got = wait_for_words<true>(
      v, s, stamp,
      [&] {
        if (wanted && !core::stamped_in(word, stamp)) word = load_word(at);
        return missing() == 0u;
      },
      [&] { return __shfl_sync(~0u, word, max(__ffs(missing()) - 1, 0)); },
      transport::WaitSite{transport::WaitPhase::ll_combine_weights, s, uint32_t(t)});
  if (got == PeerWait::arrived) {
    if (wanted) m.weight_of_slot = __uint_as_float(core::stamped_value(word));
    m.weights_to_come = false;
  }
  return got;
}

// This lane's vectors of y's packed row `row` at `col`, in the row form (zeros past the row). The host keeps
// a row's bytes below 2^32 (LlBuffer::combine), so the row's offset is one 32 x 32-bit product.
__device__ void load_y(const CombineParams& p, int32_t row, const int (&col)[2], uint4 (&data)[2]) {
  const uint64_t offset = uint64_t(uint32_t(row)) * uint32_t(2 * p.y_row_stride);
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const uint4* at = reinterpret_cast<const uint4*>(reinterpret_cast<const char*>(p.y + col[j]) + offset);
    data[j] = col[j] < p.hidden ? *at : make_uint4(0u, 0u, 0u, 0u);
  }
}

// Local order, the whole warp: this lane's vectors (at `col`) of message m's rows reduced, as BF16:
// p = 0; for its slots k ascending: p = fmaf(weight_k, y[row_k], p). kRowsInFlight rows' loads in flight at once.
// settle(m), once a batch's loads are issued and before its weights are used, returns false to give the
// message up (await_weights did not end with the weights); reduce_slots then returns false.
template <typename Settle>
__device__ bool reduce_slots(const CombineParams& p, MessageRecord& m, const int (&col)[2], uint4 (&sums)[2],
                             Settle settle) {
  float acc[2][kColsPerVector] = {};
  for (uint32_t rest = m.slots; rest != 0u;) {
    int slot[kRowsInFlight];
    uint4 in[kRowsInFlight][2];
#pragma unroll
    for (int b = 0; b < kRowsInFlight; ++b) {
      slot[b] = rest != 0u ? __ffs(rest) - 1 : -1;
      rest &= rest - 1u;
      const int32_t row = __shfl_sync(~0u, m.row_of_slot, max(slot[b], 0));
      if (slot[b] >= 0) load_y(p, row, col, in[b]);
    }
    if (!settle(m)) return false;
#pragma unroll
    for (int b = 0; b < kRowsInFlight; ++b) {
      const float w = __shfl_sync(~0u, m.weight_of_slot, max(slot[b], 0));
      if (slot[b] < 0) continue;
#pragma unroll
      for (int j = 0; j < 2; ++j) {  // past the row too (zeros; no one reads those sums): no branch a vector
#pragma unroll
        for (int i = 0; i < kColsPerVector; ++i) acc[j][i] = __fmaf_rn(w, bf16_at(in[b][j], i), acc[j][i]);
      }
    }
  }
  sums[0] = to_bf16(acc[0]);
  sums[1] = to_bf16(acc[1]);
  return true;
}

// One warp, part `part` of `parts` of message (s, t): its lines of the message's rows back to the home
// rank s (local order: reduced; naive: one row per slot). Returns false when the team failed.
// `sent`: set when the warp stores anything.
template <bool kNaive>
__device__ bool send_message(const CombineParams& p, uint64_t cseq, int s, int t, int part, int parts, SetFree& free,
                             bool& sent) {
  const LlView& v = p.v;
  const int me = v.team.rank;
  const uint32_t stamp = core::ll_stamp(cseq);
  MessageRecord m = load_record(p, s, t);
  const bool home_masked = is_masked(v, s);       // loaded with the record, not after it
  if (m.slots == 0u || home_masked) return true;  // no message from (s, t) in that dispatch, or s is masked
  core::LlWord weight_word = load_weight_word(p, s, t, m);
  PeerWait weights = PeerWait::arrived;
  const auto settle = [&](MessageRecord& r) {
    if (r.weights_to_come) weights = await_weights(p, s, t, stamp, r, weight_word);
    return weights == PeerWait::arrived;
  };
  if (!ensure_set_free<transport::TracePoint::ll_combine_free>(v, core::kLlCombine, p.set, cseq, free)) return false;
  sent = true;
  const int items = row_items(p);
  for (int g = part; g < items; g += parts) {
    int col[2];
    item_cols(p, g, col);
    uint4 data[2];
    if (kNaive) {
      for (uint32_t rest = m.slots; rest != 0u; rest &= rest - 1u) {
        const int slot = __ffs(rest) - 1;
        load_y(p, __shfl_sync(~0u, m.row_of_slot, slot), col, data);
        store_item(p, v.combine_row(s, p.set, slot, t), stamp, g, col, data);
      }
      continue;
    }
    // s masked while the warp awaited its weights: nothing more goes to s.
    if (!reduce_slots(p, m, col, data, settle)) return weights != PeerWait::failed;
    if (threadIdx.x % kWarp == 0) transport::trace<transport::TracePoint::ll_combine_reduced>(v.team);
    store_item(p, v.combine_row(s, p.set, me, t), stamp, g, col, data);
  }
  return true;
}

// Local order with the weights given here (weights_given_here): token t's warp sends slot k's weight to
// the rank r of slot k's expert (word k of combine_weights(r, set, me, t), stamped), for every r but me
// (my own messages take mine from p.weights) not masked now, after the "set is free" wait. Tokens go one
// per SM (warp 1 of CTA t) where they fit, before anything else the warp does: the expert side's
// reduction waits for them. Gives up when the team failed (the rest of the call notices it too).
__device__ void send_weights(const CombineParams& p, uint64_t cseq) {
  const LlView& v = p.v;
  const int k = int(threadIdx.x % kWarp), me = v.team.rank;
  const uint32_t stamp = core::ll_stamp(cseq);
  SetFree free = load_set_free(v, core::kLlCombine, p.set);
  for (int t = first_work_item(p.num_tokens, int(blockIdx.x), 1, kWarps); t < p.num_tokens;
       t += int(gridDim.x) * kWarps) {
    const LlHomeToken* home = v.home_of(p.dispatch_set, t);
    const bool valid = k < p.topk && ((home->slots >> k) & 1u);
    const float weight = k < p.topk ? p.weights[t * p.weights_row_stride + k] : 0.0f;
    const int r = valid ? home->slot_ranks[k] : me;
    const bool send = r != me && !is_masked(v, r);
    if (__any_sync(~0u, send) &&
        !ensure_set_free<transport::TracePoint::ll_combine_free>(v, core::kLlCombine, p.set, cseq, free)) {
      return;
    }
    if (send) store_word(v.combine_weights_of(r, p.set, me, t) + k, core::stamped(stamp, __float_as_uint(weight)));
  }
}

// Whether this launch also runs the receive step: then the home rank takes its own rows (its tokens'
// experts on this rank) from y in its receive step instead of sending them to itself through the set.
__host__ __device__ bool own_rows_direct(const CombineParams& p) { return (p.phases & kSend) && (p.phases & kReceive); }
// Local order with own_rows_direct: each warp reduces its first receive item's own rows before its
// sends (they need neither the set nor the peers), so that the receive finds them ready; those of its
// later items just before each. The lanes keep them in dynamic shared memory (kOwnPartialBytes), each its
// own two vectors (no barrier).
__host__ __device__ bool early_own_rows(const CombineParams& p) { return own_rows_direct(p) && !p.naive; }
constexpr std::size_t kOwnPartialBytes = std::size_t(kThreads) * 2 * sizeof(uint4);

// The warp's first item of a step with `items` work items (first_work_item): sends from the grid's
// start (one per SM: warp 0 of CTA i), receives from its end (the last warp of CTA CTAs - 1 - i), so that
// when the work is smaller than the grid a receive item does not share its warp with a send item (naive
// order's own rows; local order's first item has them early). The receive items of a call of few tokens
// fit one per SM (T = 1, 2026-11-23: combine 10.3 -> 10.0 us, in a row 7.5 -> 6.5); the send items count
// every message T_max allows, so they fit only with a small T_max.
__device__ int first_item(int items, bool receive) {
  return receive ? first_work_item(items, int(gridDim.x - 1 - blockIdx.x), kWarps - 1, kWarps)
                 : first_work_item(items, int(blockIdx.x), 0, kWarps);
}

template <bool kNaive>
__device__ void send(const CombineParams& p, uint64_t cseq) {
  const LlView& v = p.v;
  const int me = v.team.rank;
  const bool direct = own_rows_direct(p);
  const int messages = (direct ? v.team.nranks - 1 : v.team.nranks) * v.max_tokens;  // to every home rank but me
  const int warps = gridDim.x * kWarps, parts = int(p.by_send_parts.d);
  SetFree free = load_set_free(v, core::kLlCombine, p.set);
  bool ok = true, sent = false;
  for (int item = first_item(messages * parts, false); ok && item < messages * parts; item += warps) {
    const auto [message, part] = p.by_send_parts.split(uint32_t(item));
    const int home = int(v.by_max_tokens.quotient(message));
    const int s = direct && home >= me ? home + 1 : home;
    ok = send_message<kNaive>(p, cseq, s, int(message) - home * v.max_tokens, int(part), parts, free, sent);
  }
  if (sent && threadIdx.x % kWarp == 0) transport::trace<transport::TracePoint::ll_combine_sent>(v.team);
}

// ---- Receive ----

// Byte i of a 16-byte array of int8 held as two 8-byte words: one select and a shift. A dynamic index into
// an array in registers puts the array in local memory: a copy of the whole home record did (a 40-byte stack
// frame), and so did a select per 4-byte word where the compiler made it an index again (naive order).
__device__ int byte_at(uint64_t low, uint64_t high, int i) {
  return int(int8_t((i < 8 ? low : high) >> (8 * (i % 8))));
}

// What a receive item of token t needs of t's home record (dispatch's, v.home_of): the ranks of the rows it
// adds, 16 bytes as two 8-byte words (byte_at; local order t's destination ranks, naive each slot's rank), t's
// slots and its number of ranks. receive() loads it before own_partial, so that the two round trips overlap.
struct HomeRows {
  uint64_t ranks_low, ranks_high;
  uint32_t slots;
  int num_ranks;
};
template <bool kNaive>
__device__ HomeRows load_home(const CombineParams& p, int t) {
  const LlHomeToken* home = p.v.home_of(p.dispatch_set, t);
  // Areas and records are 8-byte aligned.
  static_assert(sizeof(home->ranks) == 16 && sizeof(home->slot_ranks) == 16 && sizeof(LlHomeToken) % 8 == 0);
  const uint64_t* rank_bytes = reinterpret_cast<const uint64_t*>(kNaive ? home->slot_ranks : home->ranks);
  return HomeRows{rank_bytes[0], rank_bytes[1], home->slots, home->num_ranks};
}

__device__ int receive_items(const CombineParams& p) { return p.num_tokens * row_items(p); }
__device__ int first_receive_item(const CombineParams& p) { return first_item(receive_items(p), true); }

// Local order, own_rows_direct: this lane's vectors of receive item `item` (token t, item g of its row) of
// my message to myself, reduced (zeros where dispatch brought me nothing from myself: slots 0), kRowsInFlight
// rows' loads in flight. Worked out before receive_item, which reads it from shared memory only where it adds
// it. Inside receive_item it had 2 rows in flight (a warp's later items took 4 round trips for a token's 8
// own rows at EP = 1); with 4 there, or held in registers across it, the kernel spilled (2026-11-29).
__device__ void own_partial(const CombineParams& p, int item, uint4 (&own)[2]) {
  const auto [t, g] = p.by_row_items.split(uint32_t(item));
  int col[2];
  item_cols(p, int(g), col);
  MessageRecord mine = load_record(p, p.v.team.rank, int(t));  // its weights are here (load_record)
  own[0] = own[1] = make_uint4(0u, 0u, 0u, 0u);
  if (mine.slots != 0u) reduce_slots(p, mine, col, own, [](MessageRecord&) { return true; });
}

// One warp: item g of out[t] (`home`: load_home's). `masked`: the CTA's view of the mask when the step
// started; `own_row`: this lane's own_partial of the item (local order with own_rows_direct), else null.
// Returns false when the team failed.
template <bool kNaive>
__device__ bool receive_item(const CombineParams& p, const bool* masked, uint32_t stamp, int t, int g,
                             const HomeRows& home, const uint4* own_row) {
  const LlView& v = p.v;
  const int me = v.team.rank;
  const int lines = row_lines(p);
  // The rows t adds: local order, one per destination rank (row r); naive, one per valid slot (row k).
  const int rows = kNaive ? __popc(home.slots) : home.num_ranks;
  uint32_t naive_rest = home.slots;
  // My own rows (own_rows_direct): naive, the record of my message to myself; local order, its partial
  // row (own_row).
  const bool direct = own_rows_direct(p);
  int col[2];
  item_cols(p, g, col);
  MessageRecord mine{0u, 0, 0.0f};
  if (direct && kNaive) mine = load_record(p, me, t);
  float acc[2][kColsPerVector] = {};
  for (int i0 = 0; i0 < rows; i0 += kReceiveRowsInFlight) {
    uint4 in[kReceiveRowsInFlight][2] = {};
    int rank[kReceiveRowsInFlight], slot[kReceiveRowsInFlight];
    bool from_y[kReceiveRowsInFlight];  // my own row (own_rows_direct), not lines
#pragma unroll
    for (int b = 0; b < kReceiveRowsInFlight; ++b) {
      slot[b] = -1;
      rank[b] = -1;
      if (i0 + b < rows) {
        if (kNaive) {
          slot[b] = __ffs(naive_rest) - 1;
          naive_rest &= naive_rest - 1u;
          rank[b] = byte_at(home.ranks_low, home.ranks_high, slot[b]);
        } else {
          rank[b] = byte_at(home.ranks_low, home.ranks_high, i0 + b);
          slot[b] = rank[b];
        }
        if (masked[rank[b]]) rank[b] = -1;
      }
      if (direct && rank[b] == me) {  // local order: own_row, read below
        if (kNaive) load_y(p, __shfl_sync(~0u, mine.row_of_slot, slot[b]), col, in[b]);
        from_y[b] = true;
        continue;
      }
      from_y[b] = false;
      if (rank[b] >= 0) issue_lines(v.combine_row(me, p.set, slot[b], t), 2 * g, 2 * g + 2, lines, in[b]);
    }
#pragma unroll
    for (int b = 0; b < kReceiveRowsInFlight; ++b) {
      if (rank[b] < 0) continue;
      // A row's lines are checked once every row's loads are out, so that their round trips overlap.
      if (!from_y[b] && !lines_carry(in[b], 2 * g, 2 * g + 2, lines, stamp)) {
        const uint4* row = v.combine_row(me, p.set, slot[b], t);
        const PeerWait got =
            wait_for_lines(v, rank[b], row, 2 * g, 2 * g + 2, lines, stamp, in[b],
                           transport::WaitSite{transport::WaitPhase::ll_combine_recv, rank[b], uint32_t(t)});
        if (got == PeerWait::failed) return false;
        if (got == PeerWait::masked) continue;  // masked while this warp waited: left out
      }
      const float w = kNaive ? p.weights[t * p.weights_row_stride + slot[b]] : 1.0f;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        // Arrived as lines, or local order's own_row (read only now: fewer registers held over the waits).
        const uint4 x = !from_y[b] ? from_line_form(in[b][j]) : kNaive ? in[b][j] : own_row[j];
#pragma unroll
        for (int i = 0; i < kColsPerVector; ++i) {
          acc[j][i] = kNaive ? __fmaf_rn(w, bf16_at(x, i), acc[j][i]) : __fadd_rn(acc[j][i], bf16_at(x, i));
        }
      }
    }
  }
  if (threadIdx.x % kWarp == 0) transport::trace<transport::TracePoint::ll_combine_lines>(v.team);
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    if (col[j] < p.hidden) *reinterpret_cast<uint4*>(p.out + t * p.out_row_stride + col[j]) = to_bf16(acc[j]);
  }
  return true;
}

// `own`: where the lanes keep each item's own_partial (local order with own_rows_direct: kOwnPartialBytes
// of dynamic shared memory, every lane its own two vectors, so no barrier), holding the warp's first
// item's already (early_own_rows); else null.
template <bool kNaive>
__device__ void receive(const CombineParams& p, uint64_t cseq, uint4 (*own)[2]) {
  const LlView& v = p.v;
  const int R = v.team.nranks;
  const uint32_t stamp = core::ll_stamp(cseq);
  __shared__ bool masked[kMaxNvlinkRanks];  // the CTA's view of the mask (protocol.cuh)
  for (int r = threadIdx.x; r < R; r += blockDim.x) masked[r] = is_masked(v, r);
  __syncthreads();
  // Every thread of the CTA read the sequence before the barrier above. The record goes out as soon as the
  // count is back, not after the CTA's items: kept in registers through the receive, the count's state was
  // spilled, and the spill's store held warp 0 for the count's round trip all the same (2026-11-29).
  FreedRecord record{core::kLlCombine};
  record.count(v);
  record.record_if_last(v, p.set, cseq);
  const int items = receive_items(p), first = first_receive_item(p);
  bool ok = true;
  for (int item = first; ok && item < items; item += gridDim.x * kWarps) {
    const auto [t, g] = p.by_row_items.split(uint32_t(item));
    const HomeRows home = load_home<kNaive>(p, int(t));  // its round trip beside own_partial's
    if (own != nullptr && item != first) own_partial(p, item, own[threadIdx.x]);
    ok = receive_item<kNaive>(p, masked, stamp, int(t), int(g), home, own != nullptr ? own[threadIdx.x] : nullptr);
  }
  if (threadIdx.x % kWarp == 0) transport::trace<transport::TracePoint::ll_combine_received>(v.team);
}

// kNaive: p.naive, a kernel of its own for each order.
template <bool kNaive>
__global__ void __launch_bounds__(kThreads) combine_kernel(CombineParams p) {
  wait_for_prior_grid();  // a programmatic dependent (launch_combine): no access before this
  if (threadIdx.x % kWarp == 0) transport::trace<transport::TracePoint::ll_combine_start>(p.v.team);
  const uint64_t cseq = begin_call(p.v, core::kLlCombine, p.set);
  if (!kNaive && (p.phases & kSend) && weights_given_here(p)) send_weights(p, cseq);
  extern __shared__ uint4 own_shared[];  // kOwnPartialBytes where early_own_rows(p)
  uint4(*own)[2] = reinterpret_cast<uint4(*)[2]>(own_shared);
  const bool early_own = !kNaive && own_rows_direct(p) && first_receive_item(p) < receive_items(p);  // early_own_rows
  if (early_own) {
    own_partial(p, first_receive_item(p), own[threadIdx.x]);
    if (threadIdx.x % kWarp == 0) transport::trace<transport::TracePoint::ll_combine_own>(p.v.team);
  }
  if (p.phases & kSend) send<kNaive>(p, cseq);
  if (p.phases & kReceive) receive<kNaive>(p, cseq, early_own ? own : nullptr);
  if (threadIdx.x == 0) transport::trace<transport::TracePoint::ll_combine_end>(p.v.team);
}

}  // namespace

void load_combine_kernel() {
  detail::load_kernel(reinterpret_cast<const void*>(combine_kernel<false>), "LL combine kernel (local order)");
  detail::load_kernel(reinterpret_cast<const void*>(combine_kernel<true>), "LL combine kernel (naive order)");
}

void launch_combine(const CombineParams& params, int num_blocks, cudaStream_t stream) {
  CombineParams p = params;
  const int items = line_items(core::ll_combine_row_lines(2 * p.hidden));
  p.by_row_items = core::Divisor::of(uint32_t(items));
  // The send step's parts per message: about one work item per warp (messages to every home rank but me
  // where own_rows_direct).
  const int messages = (own_rows_direct(p) ? p.v.team.nranks - 1 : p.v.team.nranks) * p.v.max_tokens;
  p.by_send_parts =
      core::Divisor::of(uint32_t(std::max(1, std::min(num_blocks * kWarps / std::max(messages, 1), items))));
  // A programmatic dependent of the kernel before it on the stream, as launch_dispatch's.
  launch(p.naive ? combine_kernel<true> : combine_kernel<false>, dim3(num_blocks), dim3(kThreads),
         early_own_rows(p) ? kOwnPartialBytes : 0, stream, true, "launching LL combine kernel", p);
}

}  // namespace epx::kernels::ll
