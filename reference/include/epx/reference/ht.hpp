// High-throughput (HT) dispatch and combine, global form (DESIGN.md §1.1).
//
// "Global form": the functions see every rank's inputs at once and return every rank's outputs,
// indexed by rank. Rank s is a token's home ("source"); rank r is an expert side ("receiver").
//
// Dispatch contract, for receiving rank r:
//   * Token t of source rank s is received once if it has any expert on r (layout.hpp).
//   * Rows are ordered by source rank ascending, then source token index ascending. Rows from s start
//     at handle.recv_begin(r, s) = sum over s' < s of handle.recv_count(r, s').
//   * recv_src_idx[row]        = t (the token's index within its source rank).
//   * recv_topk_idx[row][k]    = topk_idx_s[t][k] - r * E_local if that expert lives on r, else -1
//                                (also -1 where the source slot is -1).
//   * recv_topk_weights[row][k]= topk_weights_s[t][k] where recv_topk_idx[row][k] != -1, else 0.0f.
//   * recv_x[row] = x_s[t] (BF16 bits, or FP8 bits); FP8 scales travel with the row and come out
//     row-major [rows][H/128] whatever strides the input scales had.
//   * num_recv_tokens_per_expert[e] = number of rows r received naming local expert e (a row naming
//     e twice counts once), rounded up to a multiple of expert_alignment.
//   * Worst-case form (num_worst_tokens > 0): every output has num_worst_tokens rows (>= N, else
//     std::invalid_argument); padding rows N.. have recv_src_idx -1, recv_topk_idx -1, weights 0,
//     x and scales 0.
//   * Cached form: given the handle of an earlier dispatch with the same routing, rows are placed by
//     the handle's row map without recounting; the outputs equal the uncached call's.
//
// Combine contract, for home rank s and its token t:
//   out[t][h] = bf16(acc), acc = 0.0f; for r = 0 .. R-1 ascending, if t was received by r at row i:
//   acc = acc + float(y_r[i][h]); then, with a bias, acc = acc + float(bias_s[t][h]); then, with a
//   second bias, acc = acc + float(second_bias_s[t][h]). Plain float adds (no fused multiply-add
//   anywhere). Combined weights: the same sum over r of w_r[i][k], with no bias. A token received by
//   no rank gives bf16(0 + biases), i.e. 0 without a bias.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "epx/reference/routing.hpp"
#include "epx/reference/tensor.hpp"

namespace epx::ref {

enum class Dtype { bf16, fp8 };

// One rank's tokens as handed to HT dispatch. T = topk_idx.rows.
struct HtTokens {
  Dtype dtype = Dtype::bf16;
  Matrix<uint16_t> x_bf16;        // [T][H] BF16 bits, when dtype == bf16
  Matrix<uint8_t> x_fp8;          // [T][H] E4M3 bits, when dtype == fp8 (H % 128 == 0)
  StridedMatrix<float> x_scales;  // [T][H/128] when dtype == fp8; any strides
  TopkIdx topk_idx;               // [T][K]
  Matrix<float> topk_weights;     // [T][K]
};

// Routing state shared by dispatch (cached form) and combine.
struct HtHandle {
  Matrix<int32_t> recv_count;             // [R receiver][R source]: rows of source on receiver
  Matrix<int32_t> recv_begin;             // [R receiver][R source]: first such row (prefix sum)
  std::vector<int32_t> num_recv_tokens;   // [R]: N_r = rows received by rank r
  std::vector<Matrix<int32_t>> send_row;  // [R source] -> [T_s][R receiver]: row of token t on the
                                          // receiver, or -1 if it does not go there
  bool operator==(const HtHandle&) const = default;
};

// What one receiving rank gets.
struct HtRecv {
  int64_t num_recv_tokens = 0;                      // N (valid rows; rest are worst-case padding)
  Matrix<uint16_t> x_bf16;                          // [rows][H], dtype bf16
  Matrix<uint8_t> x_fp8;                            // [rows][H], dtype fp8
  Matrix<float> x_scales;                           // [rows][H/128], dtype fp8
  std::vector<int32_t> src_idx;                     // [rows]
  TopkIdx topk_idx;                                 // [rows][K], local ids
  Matrix<float> topk_weights;                       // [rows][K]
  std::vector<int32_t> num_recv_tokens_per_expert;  // [E_local]
  bool operator==(const HtRecv&) const = default;
};

struct HtDispatchOptions {
  int expert_alignment = 1;      // >= 1; per-expert counts are rounded up to a multiple of it
  int64_t num_worst_tokens = 0;  // 0: exact form (N rows); > 0: worst-case form with that many rows
};

struct HtDispatchResult {
  std::vector<HtRecv> recv;  // [R], by receiving rank
  HtHandle handle;
};

// Builds the handle from every source rank's topk_idx (validated; see layout.hpp).
HtHandle ht_make_handle(std::span<const TopkIdx> topk_idx_per_rank, const ExpertPlacement& placement);

// Exact or worst-case dispatch; tokens[s] is source rank s's input (size R).
HtDispatchResult ht_dispatch(std::span<const HtTokens> tokens, const ExpertPlacement& placement,
                             const HtDispatchOptions& options = {});

// Cached dispatch: places rows by `handle` (from an earlier call with the same routing).
HtDispatchResult ht_dispatch_cached(std::span<const HtTokens> tokens, const ExpertPlacement& placement,
                                    const HtHandle& handle, const HtDispatchOptions& options = {});

// One expert-side rank's combine input.
struct HtCombineInput {
  Matrix<uint16_t> y;          // [rows >= N_r][H] BF16
  Matrix<float> topk_weights;  // [rows >= N_r][K], or empty (0 x 0) for none; all ranks or none
};

struct HtCombineOutput {
  Matrix<uint16_t> x;          // [T_s][H] BF16
  Matrix<float> topk_weights;  // [T_s][K] when weights were given, else empty
};

// Combine; y[r] is expert-side rank r's input; bias and second_bias are each empty or one [T_s][H]
// BF16 matrix per home rank. Returns one output per home rank.
std::vector<HtCombineOutput> ht_combine(std::span<const HtCombineInput> y, const HtHandle& handle,
                                        std::span<const Matrix<uint16_t>> bias = {},
                                        std::span<const Matrix<uint16_t>> second_bias = {});

}  // namespace epx::ref
