// What the HT kernels assume of core::HtAreas, checked in one place: by the CPU unit test on chosen
// shapes and by the fuzzer on random ones.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/ht_areas.hpp"

namespace epx::test {

// Returns "" when `a` (made from `o` for `num_ranks`) keeps every invariant, else the first one broken.
inline std::string broken_ht_areas_invariant(const core::HtAreas& a, const HtBufferOptions& o, int num_ranks) {
  const std::size_t offsets[] = {
      a.notify_counts, a.notify_expert_counts,  a.done_words,   a.combine_progress, a.sequence,
      a.recv_x,        a.recv_scales,           a.recv_src_idx, a.recv_topk_idx,    a.recv_topk_weights,
      a.combine_input, a.combine_input_weights, a.total};
  for (std::size_t i = 0; i + 1 < sizeof(offsets) / sizeof(offsets[0]); ++i) {
    if (offsets[i] % 128 != 0) return "area " + std::to_string(i) + " is not 128-byte aligned";
    if (offsets[i] >= offsets[i + 1]) return "area " + std::to_string(i) + " does not end before the next";
  }
  const std::size_t R = num_ranks, rows = R * o.max_tokens_per_rank, row_bytes = std::size_t(o.hidden) * 2;
  if (a.recv_rows != int64_t(rows)) return "recv_rows is not R * max_tokens_per_rank";
  if (a.notify_expert_counts - a.notify_counts < sizeof(uint64_t) * R * (R + 1)) return "the count area is short";
  if (a.combine_progress - a.done_words < sizeof(uint64_t) * core::kHtFlagKinds * R * core::kMaxCtas)
    return "the done words are short";
  if (a.sequence - a.combine_progress < sizeof(uint64_t) * R * core::kCombineCopyCtas)
    return "the progress area is short";
  if (a.recv_scales - a.recv_x < rows * row_bytes) return "the receive area is short";
  if (a.recv_topk_weights - a.recv_topk_idx < rows * o.max_topk * sizeof(int64_t)) return "topk_idx area is short";
  if (a.combine_input_weights - a.combine_input < rows * row_bytes) return "the combine input is short";
  if (a.total - a.combine_input_weights < rows * o.max_topk * sizeof(float)) return "combine weights are short";
  return "";
}

}  // namespace epx::test
