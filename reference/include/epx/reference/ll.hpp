// Low-latency (LL) dispatch and combine, global form (DESIGN.md §1.2, §1.3).
//
// Every rank has T <= T_max tokens. Rank s is a token's home ("source"); rank r an expert side.
//
// Dedup message (§1.3): for each source token t and each destination rank r holding at least one of
// its experts, one message carries the list of (local expert id, weight) for every top-k slot whose
// expert lives on r, in slot order. A slot that repeats an earlier slot's expert is still listed
// (its weight counts in combine). Messages are ordered by token, then destination rank, ascending.
//
// Dispatch contract, packed layout on receiving rank r, with C = R * T_max rows per local expert:
//   * recv_x[e][row] is the row of token (s, t) for local expert e; rows 0 .. recv_count[e]-1 are
//     valid. A token naming the same expert in two slots gets one row (counted once).
//   * layout_range[e][s] = (begin, count): source rank s's rows for expert e are
//     begin .. begin+count-1. In the canonical order produced here, source ranks are ascending and
//     contiguous from row 0 (begin = sum of earlier ranks' counts, also for count 0), and tokens are
//     ascending within a source rank. A GPU may order the blocks and the rows inside a block freely;
//     ll_canonicalize brings such a result to the canonical order.
//   * src_idx[e][row] = t. Rows past recv_count[e] are not part of the contract; here they are zero
//     and src_idx -1.
//   * Payload: BF16 bits; or FP8 values with float scales [E_local][C][H/128] (the per-token cast of
//     fp8_cast.hpp, made once per source token); or, with UE8M0, the packed int32 scales
//     [E_local][C][H/512] instead of float scales.
//
// Combine contract (y[r] is [E_local][C][H] BF16 in the layout that dispatch produced on rank r; the
// row of (s, t, e) is found by its layout_range and src_idx):
//   * naive:  acc = 0.0f; for k = 0 .. K-1 ascending, skipping -1 slots:
//               acc = fmaf(w[t][k], float(y[rank(e_k)][local(e_k)][row][h]), acc);
//             out[t][h] = bf16(acc).
//   * local:  for each destination rank r of token t (those holding one of its experts):
//               p = 0.0f; for the slots k whose expert lives on r, ascending: p = fmaf(w, y, p);
//               partial_r = bf16(p)                     (the row that travels back over NVLink)
//             acc = 0.0f; for r ascending over those ranks: acc = acc + float(partial_r);
//             out[t][h] = bf16(acc).
//   * A token with no expert gives 0 (bits 0x0000) in both orders.
// The orders differ only in rounding; naive is the bit-exact debugging switch.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "epx/reference/routing.hpp"
#include "epx/reference/tensor.hpp"

namespace epx::ref {

// One rank's LL input. T = x.rows <= T_max.
struct LlTokens {
  Matrix<uint16_t> x;          // [T][H] BF16 bits
  TopkIdx topk_idx;            // [T][K]
  Matrix<float> topk_weights;  // [T][K] (carried in the dedup message for local combine)
};

struct LlExpertEntry {
  int32_t local_expert = 0;
  float weight = 0.0f;
  bool operator==(const LlExpertEntry&) const = default;
};

struct LlMessage {
  int32_t src_rank = 0;
  int32_t src_token = 0;
  int32_t dst_rank = 0;
  std::vector<LlExpertEntry> experts;  // slot order
  bool operator==(const LlMessage&) const = default;
};

struct RowRange {
  int32_t begin = 0;
  int32_t count = 0;
  bool operator==(const RowRange&) const = default;
};

struct LlDispatchOptions {
  bool use_fp8 = false;
  bool round_scale = false;  // needs use_fp8
  bool use_ue8m0 = false;    // needs use_fp8, round_scale and H % 512 == 0
};

// What one receiving rank gets; C = R * T_max.
struct LlRecv {
  Tensor3<uint16_t> x_bf16;         // [E_local][C][H] without FP8
  Tensor3<uint8_t> x_fp8;           // [E_local][C][H] with FP8
  Tensor3<float> x_scales;          // [E_local][C][H/128] with FP8, without UE8M0
  Tensor3<int32_t> x_scales_ue8m0;  // [E_local][C][H/512] with UE8M0
  std::vector<int32_t> recv_count;  // [E_local]
  Matrix<int32_t> src_idx;          // [E_local][C]
  Matrix<RowRange> layout_range;    // [E_local][R]
  bool operator==(const LlRecv&) const = default;
};

enum class LlCombineOrder { naive, local };

// The dedup messages that source rank src_rank sends.
std::vector<LlMessage> ll_messages(const TopkIdx& topk_idx, const Matrix<float>& topk_weights, int src_rank,
                                   const ExpertPlacement& placement);

// tokens[s] is rank s's input (size R). Returns one LlRecv per rank, in canonical order.
std::vector<LlRecv> ll_dispatch(std::span<const LlTokens> tokens, const ExpertPlacement& placement,
                                int64_t max_tokens_per_rank, const LlDispatchOptions& options = {});

// Checks that, for every expert, the ranges with count > 0 tile rows [0, recv_count) exactly
// (contiguous, non-overlapping, starting at 0), that each block's src_idx are distinct and >= 0, and
// returns the result with blocks in source-rank order and rows sorted by src_idx (payload rows move
// with them; rows past recv_count cleared). Throws std::invalid_argument otherwise. With first_source,
// the blocks go first_source, first_source + 1, ..., wrapping.
LlRecv ll_canonicalize(const LlRecv& result, int first_source = 0);

// `result` (rank `rank`'s) in the order epx's dispatch promises (epx/ll.hpp): ll_canonicalize's with the
// blocks from rank + 1 up, wrapping, the rank's own last.
LlRecv ll_in_epx_order(const LlRecv& result, int rank);

// The row of (src_rank, src_token) for local_expert in `result`, or -1 if it has none.
int64_t ll_find_row(const LlRecv& result, int64_t local_expert, int src_rank, int64_t src_token);

// The local-combine partial rows: per home rank s, [T_s][R][H] BF16, partial_r of token t at (t, r);
// zero where token t does not go to r. y, recv: per expert-side rank; topk_*: per home rank.
std::vector<Tensor3<uint16_t>> ll_local_partials(std::span<const Tensor3<uint16_t>> y, std::span<const LlRecv> recv,
                                                 std::span<const TopkIdx> topk_idx,
                                                 std::span<const Matrix<float>> topk_weights,
                                                 const ExpertPlacement& placement);

// Combine in the given order; returns out [T_s][H] BF16 per home rank s.
std::vector<Matrix<uint16_t>> ll_combine(std::span<const Tensor3<uint16_t>> y, std::span<const LlRecv> recv,
                                         std::span<const TopkIdx> topk_idx, std::span<const Matrix<float>> topk_weights,
                                         const ExpertPlacement& placement, LlCombineOrder order);

}  // namespace epx::ref
