#include "core/ll_areas.hpp"

#include <algorithm>

#include "core/area_cursor.hpp"

namespace epx::core {

LlAreas ll_areas(const LlBufferOptions& o, int num_ranks) {
  LlAreas a;
  a.num_ranks = num_ranks;
  a.max_tokens = o.max_tokens_per_rank;
  a.num_experts = o.num_experts;
  a.combine_slots = std::max(num_ranks, o.max_topk);
  const std::size_t R = num_ranks, T = o.max_tokens_per_rank, sets = kLlSets;
  const std::size_t messages = sets * R * T;

  AreaCursor shared;
  a.freed = shared.take(sizeof(uint64_t) * kLlOps * sets * R);
  a.manifests = shared.take(sizeof(LlWord) * sets * R * a.manifest_words());
  a.expert_counts = shared.take(sizeof(LlWord) * sets * R * a.experts_per_rank());
  a.headers = shared.take(sizeof(LlWord) * kLlHeaderWords * messages);
  a.payloads = shared.take(ll_row_line_bytes(o.hidden) * messages);
  a.combine_rows = shared.take(ll_combine_row_line_bytes(o.hidden) * sets * a.combine_slots * T);
  a.combine_weights = shared.take(sizeof(LlWord) * messages * o.max_topk);
  a.symmetric_bytes = shared.end();

  AreaCursor own;
  a.blocks_done = own.take(sizeof(uint32_t) * kLlOps);
  a.pending_freed = own.take(sizeof(uint64_t) * kLlOps);
  a.message_slots = own.take(sizeof(uint32_t) * messages);
  a.entry_rows = own.take(sizeof(int32_t) * messages * o.max_topk);
  a.entry_weights = own.take(sizeof(float) * messages * o.max_topk);
  a.home = own.take(sizeof(LlHomeToken) * sets * T);
  a.rank_mask = own.take(sizeof(uint32_t) * R);
  a.private_bytes = own.end();
  return a;
}

}  // namespace epx::core
