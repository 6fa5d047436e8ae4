// Where everything of an LlBuffer lives: the symmetric allocation (the same offsets on every rank) and
// the buffer's private device memory. Two sets of each communication area alternate (LlBuffer's
// "buffer sets"); dispatch and combine each have their own pair.
//
// Symmetric, on each rank ("me"), written by other ranks over NVLink:
//   flags            uint64 [kind][op][set][R peer] (op 0 dispatch, op 1 combine), a call's sequence
//                    number (src/kernels/ll/protocol.cuh): kind 0 "ready": the peer's writes to me
//                    for the call are complete; kind 1 "freed": the peer has finished reading what I
//                    wrote to it in the call
//   dispatch_tokens  int32 [set][R source]: the source's token count T_s of the call
//   expert_counts    int32 [set][R source][E_local]: how many of the source's tokens name each local expert
//   headers          LlMessageHeader [set][R source][T_max]: the dedup message of source token t
//   payloads         [set][R source][T_max][2 H] bytes: its row, BF16; or FP8 values then float scales
//   combine_rows     bf16 [set][S][T_max][H], S = max(R, K_max): row (r, t) is expert side r's partial
//                    sum of my token t (local order), row (k, t) the output of my token t's slot k (naive)
// Private (this rank's kernels only):
//   blocks_done      uint32 [op][step]: CTAs done with a step of the running kernel (zero between kernels)
//   message_slots    uint32 [set][R][T_max]: the slots of each received message (0: none came)
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

#include "epx/ll.hpp"

namespace epx::core {

inline constexpr int kLlMaxTopk = 16;
inline constexpr int kLlMaxTokens = 1024;  // T_max (message headers hold row indices as int16)
inline constexpr int kLlMaxHidden = 16384;
inline constexpr int kLlMaxExperts = 4096;  // a receive step keeps (expert, source) row offsets in shared memory
inline constexpr int kLlSets = 2;
enum LlOp : int { kLlDispatch = 0, kLlCombine = 1, kLlOps = 2 };
enum LlFlag : int { kLlReady = 0, kLlFreed = 1, kLlFlagKinds = 2 };

// One dedup message's routing part: the slots of the token whose experts live on the destination.
struct LlMessageHeader {
  uint32_t seq;           // the dispatch's sequence number: the header is valid for that call only
  uint32_t slots;         // bit k: slot k names an expert on the destination
  uint32_t unique_slots;  // the slots whose expert no earlier slot names (one row each)
  uint32_t pad;
  int16_t expert[kLlMaxTopk];     // slot k's local expert id
  int16_t block_row[kLlMaxTopk];  // the token's index among the source's tokens naming that expert
  float weight[kLlMaxTopk];       // slot k's weight (0 without dispatch weights)
};
static_assert(sizeof(LlMessageHeader) % 16 == 0, "headers are read as 16-byte vectors");

// Where one of this rank's tokens went in a dispatch (private; combine's receive step reads it).
struct LlHomeToken {
  int8_t ranks[kLlMaxTopk];       // destination ranks, ascending
  int8_t slot_ranks[kLlMaxTopk];  // slot k's destination rank (where slots has bit k)
  int32_t num_ranks;
  uint32_t slots;  // bit k: slot k named a valid expert
};

struct LlAreas {
  int num_ranks = 0, max_tokens = 0, num_experts = 0;
  int combine_slots = 0;          // S = max(R, K_max)
  std::size_t payload_bytes = 0;  // 2 H: a BF16 row; an FP8 row and its scales fit too

  // Symmetric offsets.
  std::size_t flags = 0, dispatch_tokens = 0, expert_counts = 0, headers = 0, payloads = 0, combine_rows = 0;
  std::size_t symmetric_bytes = 0;
  // Private offsets.
  std::size_t blocks_done = 0, message_slots = 0, entry_rows = 0, entry_weights = 0, home = 0, rank_mask = 0;
  std::size_t private_bytes = 0;

  int experts_per_rank() const { return num_experts / num_ranks; }
  int64_t rows_per_expert() const { return int64_t(num_ranks) * max_tokens; }  // C
};

LlAreas ll_areas(const LlBufferOptions& options, int num_ranks);

}  // namespace epx::core
