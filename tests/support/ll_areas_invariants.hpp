// What the LL kernels assume of core::LlAreas, checked in one place: by the CPU unit test on chosen
// shapes and by the fuzzer on random ones.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/ll_areas.hpp"

namespace epx::test {

// Returns "" when the areas of `o` on `num_ranks` ranks keep every invariant, else the first one broken.
inline std::string broken_ll_areas_invariant(const LlBufferOptions& o, int num_ranks) {
  const core::LlAreas a = core::ll_areas(o, num_ranks);
  const std::size_t R = num_ranks, T = o.max_tokens_per_rank, K = o.max_topk, H = o.hidden;
  const std::size_t E_local = std::size_t(o.num_experts) / R, messages = core::kLlSets * R * T;
  const std::size_t combine_slots = R > K ? R : K;
  // What the kernels index per payload and per combine row (LlView::payload_vectors, combine_row_vectors):
  // a BF16 row as lines of 112 and of 124 row bytes.
  const std::size_t payload_bytes = core::ll_row_line_bytes(int(H));
  const std::size_t combine_row_bytes = core::ll_combine_row_line_bytes(int(H));
  struct Area {
    std::size_t offset, bytes;
  };
  // Each area with the bytes the kernels index into it, in layout order; then the allocation's end.
  const Area shared[] = {{a.freed, 8 * core::kLlOps * core::kLlSets * R},
                         {a.manifests, 8 * core::kLlSets * R * ((T + 31) / 32)},
                         {a.expert_counts, 8 * core::kLlSets * R * E_local},
                         {a.headers, 8 * core::kLlHeaderWords * messages},
                         {a.payloads, payload_bytes * messages},
                         {a.combine_rows, combine_row_bytes * core::kLlSets * combine_slots * T},
                         {a.combine_weights, 8 * messages * K},
                         {a.symmetric_bytes, 0}};
  const Area own[] = {{a.blocks_done, 4 * core::kLlOps},
                      {a.pending_freed, 8 * core::kLlOps},
                      {a.message_slots, 4 * messages},
                      {a.entry_rows, 4 * messages * K},
                      {a.entry_weights, 4 * messages * K},
                      {a.home, sizeof(core::LlHomeToken) * core::kLlSets * T},
                      {a.rank_mask, 4 * R},
                      {a.private_bytes, 0}};
  const auto check = [](const Area* areas, std::size_t n, const char* what) -> std::string {
    for (std::size_t i = 0; i + 1 < n; ++i) {
      if (areas[i].offset % 128 != 0)
        return std::string(what) + " area " + std::to_string(i) + " is not 128-byte aligned";
      if (areas[i].offset + areas[i].bytes > areas[i + 1].offset) {
        return std::string(what) + " area " + std::to_string(i) + " is shorter than the kernels index";
      }
    }
    return "";
  };
  if (std::string broken = check(shared, sizeof(shared) / sizeof(shared[0]), "symmetric"); !broken.empty()) {
    return broken;
  }
  if (std::string broken = check(own, sizeof(own) / sizeof(own[0]), "private"); !broken.empty()) return broken;
  // A payload holds 112 row bytes per 128-byte line: a BF16 row (an FP8 row is half of one, its scales
  // ride in the stamp vectors), in the lines the kernels index; a combine row 124 (112 in the data
  // vectors, the rest of the row in the stamp vectors, 12 bytes in each line at most).
  if (std::size_t(core::ll_row_lines(int(2 * H))) * core::kLlLineDataBytes < 2 * H)
    return "a BF16 row does not fit its lines";
  const std::size_t combine_lines = std::size_t(core::ll_combine_row_lines(int(2 * H)));
  if (combine_lines * core::kLlCombineLineDataBytes < 2 * H) return "a BF16 row does not fit its combine lines";
  if (a.rows_per_expert() != int64_t(R * T)) return "rows_per_expert is not R * max_tokens_per_rank";
  return "";
}

}  // namespace epx::test
