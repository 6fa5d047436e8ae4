#include "epx/reference/layout.hpp"

namespace epx::ref {

bool is_repeated_expert(const TopkIdx& topk_idx, int64_t t, int64_t k) {
  for (int64_t earlier = 0; earlier < k; ++earlier) {
    if (topk_idx.at(t, earlier) == topk_idx.at(t, k)) return true;
  }
  return false;
}

Layout compute_layout(const Matrix<int64_t>& topk_idx, const ExpertPlacement& placement) {
  validate_topk_idx(topk_idx, placement);
  const int num_ranks = placement.num_ranks();
  Layout layout{std::vector<int32_t>(static_cast<std::size_t>(num_ranks), 0),
                std::vector<int32_t>(static_cast<std::size_t>(placement.num_experts()), 0),
                Matrix<uint8_t>(topk_idx.rows, num_ranks, 0)};
  for (int64_t t = 0; t < topk_idx.rows; ++t) {
    for (int64_t k = 0; k < topk_idx.cols; ++k) {
      const int64_t e = topk_idx.at(t, k);
      if (e == -1 || is_repeated_expert(topk_idx, t, k)) continue;
      layout.num_tokens_per_expert[static_cast<std::size_t>(e)] += 1;
      layout.is_token_in_rank.at(t, placement.rank_of(e)) = 1;
    }
    for (int r = 0; r < num_ranks; ++r) {
      layout.num_tokens_per_rank[static_cast<std::size_t>(r)] += layout.is_token_in_rank.at(t, r);
    }
  }
  return layout;
}

Layout compute_layout(const Matrix<int32_t>& topk_idx, const ExpertPlacement& placement) {
  return compute_layout(widen_topk_idx(topk_idx), placement);
}

}  // namespace epx::ref
