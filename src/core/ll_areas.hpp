// Where everything of an LlBuffer lives: the symmetric allocation (the same offsets on every rank) and
// the buffer's private device memory. Two sets of each communication area alternate (LlBuffer's
// "buffer sets"); dispatch and combine each have their own pair.
//
// Symmetric, on each rank ("me"), written by other ranks over NVLink:
//   freed            uint64 [op][set][R peer] (op 0 dispatch, op 1 combine), a call's sequence number
//                    (src/kernels/ll/protocol.cuh): the peer has finished reading what I wrote to it in
//                    the call (the data carries its call's stamp, so no flag says it is ready)
//   The dispatch's routing areas hold stamped words (LlWord: 4 bytes of data, the call's stamp above
//   them, one 8-byte store each), so a receiver knows a word is this call's without a flag:
//   manifests        LlWord [set][R source][T_max / 32]: word j, bit i: the source's token 32 j + i sends
//                    me a message
//   expert_counts    LlWord [set][R source][E_local]: how many of the source's tokens name each local expert
//   headers          LlWord [set][R source][T_max][kLlHeaderWords]: the dedup message of source token t
//   payloads         lines [set][R source][T_max][ll_row_lines(2 H)], kLlLineBytes each: its row as lines
//                    (below), BF16; or FP8, the float scale of group 7 i + j (j < 7) in word 1 of line
//                    8 i + j's stamp vector (8 lines carry 896 FP8 columns: 7 scale groups)
//   combine_rows     lines [set][S][T_max][ll_combine_row_lines(2 H)], S = max(R, K_max), kLlLineBytes
//                    each (124 row bytes in a line: below): row (r, t) is expert side r's partial sum (BF16) of my
//                    token t (local order), row (k, t) the output of my token t's slot k (naive); every line carries
//                    its call's stamp (rows from me to myself travel here only in send_only calls:
//                    kernels/ll/combine.cu)
//   combine_weights  LlWord [set][R home][T_max][K_max]: word k of (s, t) is slot k's weight (float bits)
//                    of home rank s's token t, for a combine whose weights come with it, not with the
//                    dispatch (kernels/ll/combine.cu; the expert side's local order needs them)
// Private (this rank's kernels only):
//   blocks_done      uint32 [op]: CTAs that have started the running receive step (zero between kernels;
//                    kernels/ll/protocol.cuh's FreedRecord)
//   pending_freed    uint64 [op]: the receive step whose "freed" signals to the peers the next kernel of
//                    the op sends (kernels/ll/protocol.cuh; 0: none)
//   message_slots    uint32 [set][R][T_max]: the slots of each received message (0: none came), and
//                    kLlWeightsAtCombine where the source's combine brings the weights
//   entry_rows       int32 [set][R][T_max][K_max]: packed row e * C + i of each slot of each received message
//   entry_weights    float [set][R][T_max][K_max]: its weight (combine reads these, not the headers,
//                    so that a dispatch set is free for reuse as soon as its receive step is over)
//   home             LlHomeToken [set][T_max]: where each of my tokens went (ranks, valid slots)
//   rank_mask        uint32 [R]: nonzero for a rank this rank no longer exchanges with (rank masking:
//                    set by the host, or by a kernel whose wait on that rank expired with
//                    LlBufferOptions::mask_on_timeout; cleared only by the host)
//
// Every array starts on a 128-byte boundary, so rows can be moved with 16-byte vectors.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/stamped_word.hpp"
#include "epx/ll.hpp"

namespace epx::core {

inline constexpr int kLlMaxTopk = 16;
inline constexpr int kLlMaxTokens = 1024;  // T_max (message headers hold row indices as int16)
inline constexpr int kLlMaxHidden = 16384;
inline constexpr int kLlMaxExperts = 4096;  // the send keeps a count per expert in shared memory
inline constexpr int kLlSets = 2;
enum LlOp : int { kLlDispatch = 0, kLlCombine = 1, kLlOps = 2 };

// A stamped word of the dispatch's areas (stamped_word.hpp): the call's stamp, ll_stamp, in the high half.
using LlWord = uint64_t;
// The stamp of call `seq` on a set: never 0 (the value of a word never written), and different for
// consecutive calls.
inline constexpr uint32_t ll_stamp(uint64_t seq) { return uint32_t(seq % 0xFFFFFFFFull) + 1u; }

// The dispatch's payloads and the combine's rows travel as lines: 128 bytes, 7 vectors of 16 row bytes (vector v of
// line l holds row bytes [112 l + 16 v, +16); zeros past the row) and a stamp vector (ll_stamp of the call in its first
// word; the rest of its words carry FP8 scales in payloads, row bytes in combine rows: below), the 8 vectors stored by
// 8 lanes of one warp in one store instruction. A reader that sees a line's stamp takes the whole line: NVLink delivers
// a warp's 128-byte line whole (NCCL's LL128 rests on the same; epx-bench's stamp probe counts torn lines in every
// run).
inline constexpr int kLlLineBytes = 128, kLlLineVectors = 8, kLlLineDataBytes = 112;
inline constexpr int ll_row_lines(int row_bytes) { return (row_bytes + kLlLineDataBytes - 1) / kLlLineDataBytes; }
// A combine row's lines carry 124 row bytes each: the 7 data vectors hold the row's first 112 L bytes (L
// lines; vector v of line l: bytes [112 l + 16 v, +16)), and words 1-3 of line l's stamp vector the
// 12 bytes [112 L + 12 l, +12) of the rest (zeros past the row). Its bytes over NVLink are 9.4% fewer
// than with 112 a line (H = 7168: 116 lines, not 128).
inline constexpr int kLlCombineLineDataBytes = kLlLineDataBytes + 12;
inline constexpr int ll_combine_row_lines(int row_bytes) {
  return (row_bytes + kLlCombineLineDataBytes - 1) / kLlCombineLineDataBytes;
}
inline constexpr std::size_t ll_combine_row_line_bytes(int hidden) {
  return std::size_t(kLlLineBytes) * ll_combine_row_lines(2 * hidden);
}
// The first BF16 column that vector `vector` of line `line` carries in a combine row of `hidden` columns
// and `lines` lines: a data vector (vector < 7) 8 columns, the stamp vector's words 1-3 (vector 7) 6, each
// word 2 (those below hidden); `hidden` where the vector carries none.
inline constexpr int ll_combine_line_col(int hidden, int lines, int line, int vector) {
  const int head = kLlLineDataBytes / 2 * line + 8 * vector;
  const int tail = kLlLineDataBytes / 2 * lines + (kLlCombineLineDataBytes - kLlLineDataBytes) / 2 * line;
  const int col = vector == kLlLineVectors - 1 ? tail : head;
  return line >= lines ? hidden : (col > hidden ? hidden : col);
}
// A combine kernel holds a line instruction's columns (4 lines: 4 k .. 4 k + 3, the lane 8 m + v holding vector v
// of line 4 k + m) in the row form: whole 16-byte vectors of the row on every lane. Lane 8 m + v (v < 7) holds
// data vector v of line 4 k + m; lanes 7, 15 and 23 (m < 3) hold the m-th aligned vector of the 48 rest bytes that
// the instruction's 4 stamp vectors carry (words 1-3 of each, in line order: bytes [112 L + 48 k, +48)); lane 31
// none. The first BF16 column of lane 8 m + v's vector of instruction k (`hidden` where it holds none). The rest
// of a row is a multiple of 16 bytes (2 H and 112 L are), so each vector lies whole inside the row or past it.
inline constexpr int ll_combine_row_form_col(int hidden, int lines, int instruction, int lane) {
  const int m = lane / kLlLineVectors, vector = lane % kLlLineVectors;
  if (vector < kLlLineVectors - 1) return ll_combine_line_col(hidden, lines, 4 * instruction + m, vector);
  const int col = kLlLineDataBytes / 2 * lines + 24 * instruction + 8 * m;
  return m == 3 || col > hidden ? hidden : col;
}
// A manifest's words (a bit per token, 32 a word) for T_max tokens.
inline constexpr int ll_manifest_words(int max_tokens) { return (max_tokens + 31) / 32; }
// The bytes of a dispatch payload of `hidden` BF16 columns as lines (an FP8 row, with its scales in the
// stamp vectors, takes about half).
inline constexpr std::size_t ll_row_line_bytes(int hidden) {
  return std::size_t(kLlLineBytes) * ll_row_lines(2 * hidden);
}

// One dedup message's routing part, the slots of the token whose experts live on the destination, as
// kLlHeaderWords data words:
//   kLlHeaderSlots: bit k: slot k names an expert on the destination; kLlWeightsAtCombine: the source's
//     dispatch had no weights, so its combine will send them (combine_weights)
//   kLlHeaderUniqueSlots: the slots whose expert no earlier slot names (one row each)
//   kLlHeaderExperts + k / 2: slot k's local expert id, int16, in the low half for even k
//   kLlHeaderBlockRows + k / 2: the token's index among the source's tokens naming that expert, likewise
//   kLlHeaderWeights + k: slot k's weight (float bits; 0 without dispatch weights)
inline constexpr int kLlHeaderSlots = 0, kLlHeaderUniqueSlots = 1, kLlHeaderExperts = 2;
inline constexpr int kLlHeaderBlockRows = kLlHeaderExperts + kLlMaxTopk / 2;
inline constexpr int kLlHeaderWeights = kLlHeaderBlockRows + kLlMaxTopk / 2;
inline constexpr int kLlHeaderWords = kLlHeaderWeights + kLlMaxTopk;  // 34
static_assert(kLlHeaderWords * sizeof(LlWord) % 16 == 0, "headers start on 16-byte boundaries");
inline constexpr uint32_t kLlSlotBits = (1u << kLlMaxTopk) - 1u, kLlWeightsAtCombine = 1u << 31;

// Where one of this rank's tokens went in a dispatch (private; combine's receive step reads it).
struct LlHomeToken {
  int8_t ranks[kLlMaxTopk];       // destination ranks, ascending
  int8_t slot_ranks[kLlMaxTopk];  // slot k's destination rank (where slots has bit k)
  int32_t num_ranks;
  uint32_t slots;  // bit k: slot k named a valid expert
};

struct LlAreas {
  int num_ranks = 0, max_tokens = 0, num_experts = 0;
  int combine_slots = 0;  // S = max(R, K_max)

  // Symmetric offsets.
  std::size_t freed = 0, manifests = 0, expert_counts = 0, headers = 0, payloads = 0, combine_rows = 0,
              combine_weights = 0;
  std::size_t symmetric_bytes = 0;
  // Private offsets.
  std::size_t blocks_done = 0, pending_freed = 0, message_slots = 0, entry_rows = 0, entry_weights = 0, home = 0,
              rank_mask = 0;
  std::size_t private_bytes = 0;

  int experts_per_rank() const { return num_experts / num_ranks; }
  int64_t rows_per_expert() const { return int64_t(num_ranks) * max_tokens; }  // C
  int manifest_words() const { return ll_manifest_words(max_tokens); }
};

LlAreas ll_areas(const LlBufferOptions& options, int num_ranks);

}  // namespace epx::core
