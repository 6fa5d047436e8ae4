// What the HT kernels receive: plain structs passed by value (no host types).
#pragma once

#include <cstdint>

#include "core/ht_areas.hpp"
#include "transport/device/team_view.hpp"

namespace epx::kernels::ht {

// The buffer's symmetric areas on every rank, with the offsets of core::HtAreas.
struct BufferView {
  transport::TeamView team;
  transport::SymmetricView base;  // base.base[r]: rank r's HtBuffer allocation
  uint64_t notify_counts, notify_expert_counts, done_words, combine_progress, sequence;
  uint64_t recv_x, recv_scales, recv_src_idx, recv_topk_idx, recv_topk_weights;
  uint64_t combine_input, combine_input_weights;
  int32_t num_experts;

  template <typename T>
  __host__ __device__ T* at(int rank, uint64_t offset) const {
    return reinterpret_cast<T*>(base.base[rank] + offset);
  }
  __host__ __device__ int experts_per_rank() const { return num_experts / team.nranks; }
  // notify_counts is [R source][R + 1] stamped words: the source's tokens per destination rank, then its
  // status (core::stamped: the low 32 bits of the dispatch's call number above the value).
  __host__ __device__ int notify_stride() const { return team.nranks + 1; }
  // owner's done word of CTA c of `source`'s kernel (core::HtFlag kind `kind`).
  __device__ uint64_t* done_word(int owner, int kind, int source, int c) const {
    return at<uint64_t>(owner, done_words) + (int64_t(kind) * team.nranks + source) * core::kMaxCtas + c;
  }
  // owner's progress word of copy CTA l of expert side r (core::kCombineCopyCtas of them).
  __device__ uint64_t* combine_progress_of(int owner, int r, int l) const {
    return at<uint64_t>(owner, combine_progress) + r * core::kCombineCopyCtas + l;
  }
};

// Where an invalid input was found (host-mapped, written by the layout kernel).
struct InputError {
  int32_t found;  // 0 or 1
  int32_t token, slot;
  int64_t value;
};

// Routing state of one dispatch, kept by its HtHandle (device memory owned by the handle).
// HandleView::status when the count exchange's wait expired (the team failed).
constexpr int32_t kStatusTeamFailed = -1;

// Tokens each CTA of the layout kernel covers (a tile: its partial expert counts are one row). Its
// latency is mostly the CTA's own chain (ids, counts, scans); more, smaller tiles shorten it until the
// wait for the earlier tiles and the last tile's sum over all partial rows grow. Measured at T = 4096
// (nvidia-h200-x2, 2026-11-22, bench/results/*-7725d9c-layout-tiles.log): layout 13.5 us with 1024, 10.0 with
// 256, 11.7 with 128 (untraced builds).
constexpr int kLayoutTokensPerCta = 256;
// The layout tiles of `tokens` tokens (the last one may be partial).
__host__ __device__ constexpr int layout_tiles(int64_t tokens) {
  return int((tokens + kLayoutTokensPerCta - 1) / kLayoutTokensPerCta);
}

struct HandleView {
  int32_t* send_pos;        // [T][R]: index of token t among this rank's tokens for rank r, -1 if not sent
  int32_t* send_begin;      // [R]: first row of this rank's rows on rank r
  int32_t* recv_begin;      // [R + 1]: rows from source s are [recv_begin[s], recv_begin[s + 1]); [R] = N
  int32_t* expert_counts;   // [E_local]: received rows per local expert, aligned
  int32_t* rank_counts;     // [R]: this rank's tokens per destination rank (layout)
  int32_t* count_matrix;    // [R][R]: the team's, [s][d] = tokens rank s sends rank d (0s after a failed input)
  int32_t* expert_totals;   // [E]: this rank's tokens naming each expert (the layout's)
  int32_t* status;          // [1]: 0; 1 + the rank whose input was invalid; or kStatusTeamFailed.
                            // Anything but 0: nothing is sent
  InputError* input_error;  // [1]: this rank's invalid input found by the layout kernel
};

// What the kernels tell the host (host-mapped, one per buffer).
//   * Per call: the host passes a new `ticket` to the dispatch kernel, whose count exchange writes num_recv and
//     expert_counts, a system fence, then ready = ticket. An exact-form call waits for its ticket (a
//     replayed graph of an older call writes an older ticket, never this one).
//   * Sticky: a failed input or a worst-case overflow is recorded by a kernel and stays until the host
//     reports it (at the end of an exact call, or at the entry of the next call), then clears it.
struct HostMailbox {
  uint32_t ready;
  int32_t num_recv;          // N
  int32_t failed_rank;       // sticky: -1, or the first rank whose input was invalid (nothing was sent)
  int32_t overflow;          // sticky: 0, or N of a worst-case call whose N exceeded num_worst_tokens
  InputError input;          // sticky: this rank's invalid input to a dispatch, if any
  InputError layout_input;   // sticky: an invalid input to get_layout
  int32_t expert_counts[1];  // [E_local], allocated to size
};

struct TokensView {  // one rank's dispatch input
  const uint8_t* x;
  int64_t x_row_bytes_stride;
  int32_t x_row_bytes;  // H * element size
  int32_t hidden;       // H of x (at most the buffer's)
  const float* scales;  // fp8 only, else null
  int64_t scale_row_stride, scale_col_stride;
  const void* topk_idx;
  bool topk_int64;
  int64_t topk_row_stride;
  const float* weights;  // may be null
  int64_t weights_row_stride;
  int32_t num_tokens, topk;
  __device__ int scale_cols() const { return scales != nullptr ? hidden / 128 : 0; }  // FP8 scales per row
};

}  // namespace epx::kernels::ht
