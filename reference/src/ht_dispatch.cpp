// HT dispatch, global form. See ht.hpp for the contract.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "epx/reference/fp8_cast.hpp"
#include "epx/reference/ht.hpp"
#include "epx/reference/layout.hpp"

namespace epx::ref {

namespace {

// Shapes every rank's input must share.
struct TokenShape {
  Dtype dtype;
  int64_t hidden;
  int64_t topk;
};

[[noreturn]] void fail(const std::string& message) { throw std::invalid_argument("ht_dispatch: " + message); }

TokenShape check_tokens(std::span<const HtTokens> tokens, const ExpertPlacement& placement) {
  if (static_cast<int64_t>(tokens.size()) != placement.num_ranks()) {
    fail("expected one input per rank (" + std::to_string(placement.num_ranks()) + "), got " +
         std::to_string(tokens.size()));
  }
  const HtTokens& first = tokens.front();
  const TokenShape shape{first.dtype, first.dtype == Dtype::bf16 ? first.x_bf16.cols : first.x_fp8.cols,
                         first.topk_idx.cols};
  for (std::size_t s = 0; s < tokens.size(); ++s) {
    const HtTokens& in = tokens[s];
    const std::string where = "rank " + std::to_string(s) + ": ";
    const int64_t num_tokens = in.topk_idx.rows;
    validate_topk_idx(in.topk_idx, placement);
    if (in.dtype != shape.dtype) fail(where + "all ranks must use the same dtype");
    if (in.topk_idx.cols != shape.topk) fail(where + "all ranks must use the same top-k");
    if (in.topk_weights.rows != num_tokens || in.topk_weights.cols != shape.topk) {
      fail(where + "topk_weights must be [T][K] like topk_idx");
    }
    if (shape.dtype == Dtype::bf16) {
      if (in.x_bf16.rows != num_tokens || in.x_bf16.cols != shape.hidden) {
        fail(where + "x must be [T][H] with the same H on every rank");
      }
    } else {
      if (in.x_fp8.rows != num_tokens || in.x_fp8.cols != shape.hidden) {
        fail(where + "x must be [T][H] with the same H on every rank");
      }
      if (shape.hidden % kFp8GroupSize != 0) fail("FP8 hidden size must be a multiple of 128");
      if (in.x_scales.rows != num_tokens || in.x_scales.cols != shape.hidden / kFp8GroupSize) {
        fail(where + "x_scales must be [T][H/128]");
      }
    }
  }
  return shape;
}

// A handle may only be reused with the routing it was made from: every token must map to a row
// exactly where it goes, and no two tokens may share a row.
void check_handle(const HtHandle& handle, std::span<const HtTokens> tokens, const ExpertPlacement& placement) {
  const int num_ranks = placement.num_ranks();
  if (static_cast<int64_t>(handle.num_recv_tokens.size()) != num_ranks ||
      static_cast<int64_t>(handle.send_row.size()) != num_ranks) {
    fail("handle was made for a different number of ranks");
  }
  std::vector<std::vector<int>> hits(static_cast<std::size_t>(num_ranks));
  for (int r = 0; r < num_ranks; ++r) {
    hits[static_cast<std::size_t>(r)].assign(
        static_cast<std::size_t>(handle.num_recv_tokens[static_cast<std::size_t>(r)]), 0);
  }
  for (int s = 0; s < num_ranks; ++s) {
    const Layout layout = compute_layout(tokens[static_cast<std::size_t>(s)].topk_idx, placement);
    const Matrix<int32_t>& rows = handle.send_row[static_cast<std::size_t>(s)];
    if (rows.rows != layout.is_token_in_rank.rows || rows.cols != num_ranks) {
      fail("handle's row map of rank " + std::to_string(s) + " has the wrong shape");
    }
    for (int64_t t = 0; t < rows.rows; ++t) {
      for (int r = 0; r < num_ranks; ++r) {
        const int32_t row = rows.at(t, r);
        const bool goes = layout.is_token_in_rank.at(t, r) != 0;
        auto& rank_hits = hits[static_cast<std::size_t>(r)];
        if (goes != (row != -1) || row < -1 || row >= static_cast<int64_t>(rank_hits.size())) {
          fail("handle does not match the routing (rank " + std::to_string(s) + ", token " + std::to_string(t) +
               ", destination " + std::to_string(r) + ")");
        }
        if (row != -1 && ++rank_hits[static_cast<std::size_t>(row)] > 1) {
          fail("handle maps two tokens to row " + std::to_string(row) + " of rank " + std::to_string(r));
        }
      }
    }
  }
}

// Rows received by rank r, placed by the handle's row map.
HtRecv receive(int r, std::span<const HtTokens> tokens, const TokenShape& shape, const ExpertPlacement& placement,
               const HtHandle& handle, const HtDispatchOptions& options) {
  const int64_t num_valid = handle.num_recv_tokens[static_cast<std::size_t>(r)];
  if (options.num_worst_tokens > 0 && options.num_worst_tokens < num_valid) {
    fail("num_worst_tokens " + std::to_string(options.num_worst_tokens) + " < " + std::to_string(num_valid) +
         " tokens received by rank " + std::to_string(r));
  }
  const int64_t num_rows = options.num_worst_tokens > 0 ? options.num_worst_tokens : num_valid;

  HtRecv out;
  out.num_recv_tokens = num_valid;
  if (shape.dtype == Dtype::bf16) {
    out.x_bf16 = Matrix<uint16_t>(num_rows, shape.hidden, 0);
  } else {
    out.x_fp8 = Matrix<uint8_t>(num_rows, shape.hidden, 0);
    out.x_scales = Matrix<float>(num_rows, shape.hidden / kFp8GroupSize, 0.0f);
  }
  out.src_idx.assign(static_cast<std::size_t>(num_rows), -1);  // -1 marks padding rows
  out.topk_idx = TopkIdx(num_rows, shape.topk, -1);
  out.topk_weights = Matrix<float>(num_rows, shape.topk, 0.0f);

  for (int s = 0; s < placement.num_ranks(); ++s) {
    const HtTokens& in = tokens[static_cast<std::size_t>(s)];
    const Matrix<int32_t>& send_row = handle.send_row[static_cast<std::size_t>(s)];
    for (int64_t t = 0; t < in.topk_idx.rows; ++t) {
      const int32_t row = send_row.at(t, r);
      if (row == -1) continue;
      if (shape.dtype == Dtype::bf16) {
        std::ranges::copy(in.x_bf16.row(t), out.x_bf16.row(row).begin());
      } else {
        std::ranges::copy(in.x_fp8.row(t), out.x_fp8.row(row).begin());
      }
      for (int64_t g = 0; g < out.x_scales.cols; ++g) out.x_scales.at(row, g) = in.x_scales.at(t, g);
      out.src_idx[static_cast<std::size_t>(row)] = static_cast<int32_t>(t);
      for (int64_t k = 0; k < shape.topk; ++k) {
        const int64_t local = placement.local_id(in.topk_idx.at(t, k), r);
        out.topk_idx.at(row, k) = local;
        out.topk_weights.at(row, k) = local == -1 ? 0.0f : in.topk_weights.at(t, k);
      }
    }
  }

  // Per-expert counts over the valid rows; a row naming an expert twice counts once.
  const int alignment = options.expert_alignment;
  out.num_recv_tokens_per_expert.assign(static_cast<std::size_t>(placement.experts_per_rank()), 0);
  for (int64_t row = 0; row < num_valid; ++row) {
    for (int64_t k = 0; k < shape.topk; ++k) {
      const int64_t e = out.topk_idx.at(row, k);
      if (e == -1 || is_repeated_expert(out.topk_idx, row, k)) continue;
      out.num_recv_tokens_per_expert[static_cast<std::size_t>(e)] += 1;
    }
  }
  for (int32_t& count : out.num_recv_tokens_per_expert) count = (count + alignment - 1) / alignment * alignment;
  return out;
}

HtDispatchResult dispatch_with_handle(std::span<const HtTokens> tokens, const TokenShape& shape,
                                      const ExpertPlacement& placement, const HtHandle& handle,
                                      const HtDispatchOptions& options) {
  if (options.expert_alignment < 1) fail("expert_alignment must be >= 1");
  if (options.num_worst_tokens < 0) fail("num_worst_tokens must be >= 0");
  HtDispatchResult result{{}, handle};
  for (int r = 0; r < placement.num_ranks(); ++r) {
    result.recv.push_back(receive(r, tokens, shape, placement, handle, options));
  }
  return result;
}

}  // namespace

HtHandle ht_make_handle(std::span<const TopkIdx> topk_idx_per_rank, const ExpertPlacement& placement) {
  const int num_ranks = placement.num_ranks();
  if (static_cast<int64_t>(topk_idx_per_rank.size()) != num_ranks) fail("expected one topk_idx per rank");
  std::vector<Layout> layouts;
  for (const TopkIdx& topk_idx : topk_idx_per_rank) layouts.push_back(compute_layout(topk_idx, placement));

  HtHandle handle{Matrix<int32_t>(num_ranks, num_ranks, 0),
                  Matrix<int32_t>(num_ranks, num_ranks, 0),
                  std::vector<int32_t>(static_cast<std::size_t>(num_ranks), 0),
                  {}};
  for (int r = 0; r < num_ranks; ++r) {
    int32_t next_row = 0;  // rows are grouped by source rank, ascending
    for (int s = 0; s < num_ranks; ++s) {
      const int32_t count = layouts[static_cast<std::size_t>(s)].num_tokens_per_rank[static_cast<std::size_t>(r)];
      handle.recv_count.at(r, s) = count;
      handle.recv_begin.at(r, s) = next_row;
      next_row += count;
    }
    handle.num_recv_tokens[static_cast<std::size_t>(r)] = next_row;
  }
  for (int s = 0; s < num_ranks; ++s) {
    const Matrix<uint8_t>& in_rank = layouts[static_cast<std::size_t>(s)].is_token_in_rank;
    Matrix<int32_t> send_row(in_rank.rows, num_ranks, -1);
    for (int r = 0; r < num_ranks; ++r) {
      int32_t next_row = handle.recv_begin.at(r, s);  // tokens ascending within the source block
      for (int64_t t = 0; t < in_rank.rows; ++t) {
        if (in_rank.at(t, r) != 0) send_row.at(t, r) = next_row++;
      }
    }
    handle.send_row.push_back(std::move(send_row));
  }
  return handle;
}

HtDispatchResult ht_dispatch(std::span<const HtTokens> tokens, const ExpertPlacement& placement,
                             const HtDispatchOptions& options) {
  const TokenShape shape = check_tokens(tokens, placement);
  std::vector<TopkIdx> topk_idx_per_rank;
  for (const HtTokens& in : tokens) topk_idx_per_rank.push_back(in.topk_idx);
  return dispatch_with_handle(tokens, shape, placement, ht_make_handle(topk_idx_per_rank, placement), options);
}

HtDispatchResult ht_dispatch_cached(std::span<const HtTokens> tokens, const ExpertPlacement& placement,
                                    const HtHandle& handle, const HtDispatchOptions& options) {
  const TokenShape shape = check_tokens(tokens, placement);
  check_handle(handle, tokens, placement);
  return dispatch_with_handle(tokens, shape, placement, handle, options);
}

}  // namespace epx::ref
