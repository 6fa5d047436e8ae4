// Dispatch layout (DESIGN.md §1.1): how many tokens go to each rank and expert.
//
// Contract, for one rank's topk_idx [T][K]:
//   is_token_in_rank[t][r]   = 1 if any slot of token t names an expert living on rank r, else 0.
//                              A token goes to a rank once, however many of its experts live there.
//   num_tokens_per_rank[r]   = sum over t of is_token_in_rank[t][r].
//   num_tokens_per_expert[e] = number of tokens with at least one slot naming e. A token that names
//                              the same expert in two slots (routers should not do this) counts once.
// Slots holding -1 are ignored. Any other id outside [0, E) throws std::invalid_argument naming the
// token, the slot and the value.
#pragma once

#include <cstdint>
#include <vector>

#include "epx/reference/routing.hpp"
#include "epx/reference/tensor.hpp"

namespace epx::ref {

struct Layout {
  std::vector<int32_t> num_tokens_per_rank;    // [R]
  std::vector<int32_t> num_tokens_per_expert;  // [E]
  Matrix<uint8_t> is_token_in_rank;            // [T][R], 0 or 1
};

Layout compute_layout(const Matrix<int64_t>& topk_idx, const ExpertPlacement& placement);
Layout compute_layout(const Matrix<int32_t>& topk_idx, const ExpertPlacement& placement);

// True if token t names expert e in an earlier slot than k (so slot k is a repeat).
bool is_repeated_expert(const TopkIdx& topk_idx, int64_t t, int64_t k);

}  // namespace epx::ref
