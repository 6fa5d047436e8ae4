// Expert placement and top-k routing tables (DESIGN.md §1, notation).
//
// R ranks, E experts with E % R == 0, E_local = E / R; expert e lives on rank e / E_local and is
// local expert e - r * E_local there. topk_idx is [T][K]; -1 means "no expert" for that slot.
#pragma once

#include <cstdint>

#include "epx/reference/tensor.hpp"

namespace epx::ref {

// A top-k table. The reference keeps ids as int64; int32 tables are widened (losslessly) first.
using TopkIdx = Matrix<int64_t>;

class ExpertPlacement {
 public:
  // Throws std::invalid_argument unless num_ranks >= 1, num_experts >= 1 and
  // num_experts % num_ranks == 0.
  ExpertPlacement(int num_experts, int num_ranks);

  int num_experts() const { return num_experts_; }
  int num_ranks() const { return num_ranks_; }
  int experts_per_rank() const { return num_experts_ / num_ranks_; }

  // The rank that holds global expert `expert` (which must lie in [0, E)).
  int rank_of(int64_t expert) const;
  // The local id of global expert `expert` on `rank`, or -1 when expert is -1 or lives elsewhere.
  int64_t local_id(int64_t expert, int rank) const;

 private:
  int num_experts_;
  int num_ranks_;
};

// Widens an int32 table (the other accepted dtype) to the reference's int64 form.
TopkIdx widen_topk_idx(const Matrix<int32_t>& topk_idx);

// Throws std::invalid_argument naming the token, the slot and the value for the first entry that is
// neither -1 nor an expert id in [0, E).
void validate_topk_idx(const TopkIdx& topk_idx, const ExpertPlacement& placement);

}  // namespace epx::ref
