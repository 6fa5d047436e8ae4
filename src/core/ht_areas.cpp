#include "core/ht_areas.hpp"

namespace epx::core {
namespace {

constexpr std::size_t kAlign = 128;

std::size_t take(std::size_t& cursor, std::size_t bytes) {
  const std::size_t at = (cursor + kAlign - 1) / kAlign * kAlign;
  cursor = at + bytes;
  return at;
}

}  // namespace

HtAreas ht_areas(const HtBufferOptions& o, int num_ranks) {
  HtAreas a;
  a.num_ranks = num_ranks;
  a.hidden = o.hidden;
  a.num_experts = o.num_experts;
  a.recv_rows = int64_t(num_ranks) * o.max_tokens_per_rank;
  a.x_row_bytes = std::size_t(o.hidden) * 2;
  const std::size_t R = num_ranks, K = o.max_topk, rows = a.recv_rows;
  std::size_t c = 0;
  a.notify_counts = take(c, sizeof(int32_t) * R * (R + 1));
  a.notify_expert_counts = take(c, sizeof(int32_t) * R * a.experts_per_rank());
  a.flags = take(c, sizeof(uint64_t) * kHtFlagKinds * R);
  a.sequence = take(c, sizeof(uint64_t) * kHtFlagKinds);
  a.recv_x = take(c, rows * a.x_row_bytes);
  a.recv_scales = take(c, rows * sizeof(float) * a.scale_cols());
  a.recv_src_idx = take(c, rows * sizeof(int32_t));
  a.recv_topk_idx = take(c, rows * sizeof(int64_t) * K);
  a.recv_topk_weights = take(c, rows * sizeof(float) * K);
  a.combine_input = take(c, rows * a.x_row_bytes);
  a.combine_input_weights = take(c, rows * sizeof(float) * K);
  a.total = (c + kAlign - 1) / kAlign * kAlign;
  return a;
}

}  // namespace epx::core
