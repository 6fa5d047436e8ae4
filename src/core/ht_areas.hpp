// Where everything of an HtBuffer lives in its symmetric allocation (the same offsets on every rank).
//
//   control   notify counts and done words (see src/kernels/ht/count_exchange.cuh and protocol.cuh for who
//             writes what), and the progress words of the combine input's copy
//             (src/kernels/ht/combine_input.cu)
//   dispatch  the receive area: R * T_max rows of x, scales, src_idx, topk_idx, topk_weights
//   combine   combine's input: one row of y (and weights) per received row, which the home ranks read
//
// Every array starts on a 128-byte boundary, so rows can be moved with 16-byte vectors.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/stamped_word.hpp"
#include "core/validate.hpp"
#include "epx/ht.hpp"

namespace epx::core {

// The "done" signals of an HtBuffer: stamped words [kind][source rank][CTA] in the receiving rank's
// control area. CTA c of the source's kernel for call n stores stamped(n, its grid size) into word c once
// its part is done, so a waiter knows from word 0 how many words to wait for (src/kernels/ht/protocol.cuh).
// sequence[kind] is this rank's call number of the op that signals that kind.
enum HtFlag : int {
  kDispatchDone = 0,  // source s finished writing its rows to me
  kCombineDone,       // home rank s finished reading my combine input
  kHtFlagKinds
};

// The combine input's rows for one home rank come in groups of kCombineCopyRows rows (of that rank's
// block); kCombineCopyCtas CTAs of the copy kernel share them, CTA l taking groups l, l + kCombineCopyCtas, ...
// in order, and each tells the home rank how many it has copied (src/kernels/ht/combine_input.cu).
inline constexpr int kCombineCopyRows = 16;
inline constexpr int kCombineCopyCtas = 32;
// HT's stamped words (stamped_word.hpp) carry the low 32 bits of the call number. A reader asks for its own call's
// stamp, equal, never "at least": a word holds this call's stamp or an earlier call's (never a later one: see each
// protocol), and an equal test keeps working when call numbers pass 2^32, as long as a word is not taken at its value
// exactly 2^32 calls after it was last written (a word never written reads as call 0's stamp). The dispatch rewrites
// every count word in every call that reads it, and buffers start at call 1. A copy CTA l rewrites its progress word
// only in a call where it has groups; when it has none, the block has at most l groups, and what its word promises (at
// least l groups) covers none of them, whatever the word holds (combine.cu: the prefix is a minimum over the words).
// The done words (src/kernels/ht/protocol.cuh) differ: a waiter also takes the next call's stamp (a combine CTA that
// reads nothing of a rank may signal that rank's next call early), so a word is misread only when it was last written
// 2^32 or 2^32 - 1 calls before; a word is rewritten in every call whose grid has its CTA, and one never written is
// never taken (its value, 0, is no grid size).
// Used for the dispatch's counts, for the combine copy's progress words (the groups copied; all of them:
// kEveryGroup) and for the done words (the sender's grid size).
inline constexpr uint32_t kEveryGroup = 0xFFFFFFFFu;

struct HtAreas {
  int num_ranks = 0;
  int hidden = 0;
  int num_experts = 0;
  int64_t recv_rows = 0;        // R * T_max
  std::size_t x_row_bytes = 0;  // H * 2: the widest (BF16) row; received rows are dense in the dtype of x

  // Offsets in the symmetric allocation.
  std::size_t notify_counts = 0;  // stamped [R source][R + 1]: source's tokens per destination rank, then its status
  std::size_t notify_expert_counts = 0;   // stamped [R source][E_local]: source's tokens per local expert
  std::size_t done_words = 0;             // stamped [kHtFlagKinds][R source][kMaxCtas]
  std::size_t combine_progress = 0;       // uint64 [R expert side][kCombineCopyCtas]: progress words of the copies
                                          // of my rows into each rank's combine input
  std::size_t sequence = 0;               // uint64 [kHtFlagKinds]: this rank's call numbers (owner only;
                                          // kept on the device so that replayed CUDA graphs advance them)
  std::size_t recv_x = 0;                 // [recv_rows][x_row_bytes]
  std::size_t recv_scales = 0;            // float [recv_rows][H/128]
  std::size_t recv_src_idx = 0;           // int32 [recv_rows]
  std::size_t recv_topk_idx = 0;          // int64 or int32 [recv_rows][K_max] (8 bytes reserved)
  std::size_t recv_topk_weights = 0;      // float [recv_rows][K_max]
  std::size_t combine_input = 0;          // bf16 [recv_rows][H]: combine's y, read by the home ranks
  std::size_t combine_input_weights = 0;  // float [recv_rows][K_max]: combine's weights
  std::size_t total = 0;

  int experts_per_rank() const { return num_experts / num_ranks; }
  int scale_cols() const { return hidden / 128; }
};

HtAreas ht_areas(const HtBufferOptions& options, int num_ranks);

}  // namespace epx::core
