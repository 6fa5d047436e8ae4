#include "epx/reference/routing.hpp"

#include <stdexcept>
#include <string>

namespace epx::ref {

ExpertPlacement::ExpertPlacement(int num_experts, int num_ranks) : num_experts_(num_experts), num_ranks_(num_ranks) {
  if (num_ranks < 1 || num_experts < 1 || num_experts % num_ranks != 0) {
    throw std::invalid_argument("ExpertPlacement: num_experts (" + std::to_string(num_experts) +
                                ") must be a positive multiple of num_ranks (" + std::to_string(num_ranks) + ")");
  }
}

int ExpertPlacement::rank_of(int64_t expert) const {
  if (expert < 0 || expert >= num_experts_) {
    throw std::invalid_argument("ExpertPlacement::rank_of: expert id " + std::to_string(expert) + " outside [0, " +
                                std::to_string(num_experts_) + ")");
  }
  return static_cast<int>(expert / experts_per_rank());
}

int64_t ExpertPlacement::local_id(int64_t expert, int rank) const {
  if (expert == -1 || rank_of(expert) != rank) return -1;
  return expert - static_cast<int64_t>(rank) * experts_per_rank();
}

TopkIdx widen_topk_idx(const Matrix<int32_t>& topk_idx) {
  TopkIdx wide(topk_idx.rows, topk_idx.cols);
  for (int64_t t = 0; t < topk_idx.rows; ++t) {
    for (int64_t k = 0; k < topk_idx.cols; ++k) wide.at(t, k) = topk_idx.at(t, k);
  }
  return wide;
}

void validate_topk_idx(const TopkIdx& topk_idx, const ExpertPlacement& placement) {
  for (int64_t t = 0; t < topk_idx.rows; ++t) {
    for (int64_t k = 0; k < topk_idx.cols; ++k) {
      const int64_t e = topk_idx.at(t, k);
      if (e != -1 && (e < 0 || e >= placement.num_experts())) {
        throw std::invalid_argument("topk_idx: token " + std::to_string(t) + ", slot " + std::to_string(k) +
                                    ": expert id " + std::to_string(e) + " is neither -1 nor in [0, " +
                                    std::to_string(placement.num_experts()) + ")");
      }
    }
  }
}

}  // namespace epx::ref
