#include "core/ht_areas.hpp"

#include "core/area_cursor.hpp"

namespace epx::core {

HtAreas ht_areas(const HtBufferOptions& o, int num_ranks) {
  HtAreas a;
  a.num_ranks = num_ranks;
  a.hidden = o.hidden;
  a.num_experts = o.num_experts;
  a.recv_rows = int64_t(num_ranks) * o.max_tokens_per_rank;
  a.x_row_bytes = std::size_t(o.hidden) * 2;
  const std::size_t R = num_ranks, K = o.max_topk, rows = a.recv_rows;
  AreaCursor c;
  a.notify_counts = c.take(sizeof(uint64_t) * R * (R + 1));
  a.notify_expert_counts = c.take(sizeof(uint64_t) * R * a.experts_per_rank());
  a.done_words = c.take(sizeof(uint64_t) * kHtFlagKinds * R * kMaxCtas);
  a.combine_progress = c.take(sizeof(uint64_t) * R * kCombineCopyCtas);
  a.sequence = c.take(sizeof(uint64_t) * kHtFlagKinds);
  a.recv_x = c.take(rows * a.x_row_bytes);
  a.recv_scales = c.take(rows * sizeof(float) * a.scale_cols());
  a.recv_src_idx = c.take(rows * sizeof(int32_t));
  a.recv_topk_idx = c.take(rows * sizeof(int64_t) * K);
  a.recv_topk_weights = c.take(rows * sizeof(float) * K);
  a.combine_input = c.take(rows * a.x_row_bytes);
  a.combine_input_weights = c.take(rows * sizeof(float) * K);
  a.total = c.end();
  return a;
}

}  // namespace epx::core
