// Canonical order for LL dispatch results, and row lookup. See ll.hpp.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "epx/reference/ll.hpp"

namespace epx::ref {

namespace {

[[noreturn]] void fail(int64_t expert, const std::string& message) {
  throw std::invalid_argument("ll_canonicalize: local expert " + std::to_string(expert) + ": " + message);
}

// A payload tensor is either absent (empty) or shaped [E_local][C][*].
template <class T>
void check_payload(const Tensor3<T>& payload, int64_t num_local, int64_t capacity, const char* name) {
  if (payload.data.empty()) return;
  if (payload.dim0 != num_local || payload.dim1 != capacity) {
    throw std::invalid_argument(std::string("ll_canonicalize: ") + name + " must be [E_local][C][*]");
  }
}

template <class T>
void move_row(const Tensor3<T>& from, Tensor3<T>& to, int64_t expert, int64_t from_row, int64_t to_row) {
  if (from.data.empty()) return;
  for (int64_t c = 0; c < from.dim2; ++c) to.at(expert, to_row, c) = from.at(expert, from_row, c);
}

// The ranges with rows must tile [0, count) exactly.
void check_ranges(const LlRecv& result, int64_t e, int64_t count, int64_t capacity) {
  if (count < 0 || count > capacity) fail(e, "recv_count " + std::to_string(count) + " outside [0, C]");
  std::vector<RowRange> used;
  for (int64_t s = 0; s < result.layout_range.cols; ++s) {
    const RowRange range = result.layout_range.at(e, s);
    if (range.count < 0) fail(e, "negative count for source rank " + std::to_string(s));
    if (range.count > 0) used.push_back(range);
  }
  std::sort(used.begin(), used.end(), [](RowRange a, RowRange b) { return a.begin < b.begin; });
  int64_t next = 0;
  for (const RowRange& range : used) {
    if (range.begin != next) {
      fail(e, "range starting at " + std::to_string(range.begin) + " where row " + std::to_string(next) +
                  " was expected (ranges must be contiguous, non-overlapping and start at 0)");
    }
    next += range.count;
  }
  if (next != count) fail(e, "ranges cover " + std::to_string(next) + " rows, recv_count is " + std::to_string(count));
}

}  // namespace

LlRecv ll_canonicalize(const LlRecv& result, int first_source) {
  const int64_t num_local = result.src_idx.rows;
  const int64_t capacity = result.src_idx.cols;
  const int64_t num_ranks = result.layout_range.cols;
  if (static_cast<int64_t>(result.recv_count.size()) != num_local || result.layout_range.rows != num_local) {
    throw std::invalid_argument("ll_canonicalize: recv_count, src_idx and layout_range disagree on E_local");
  }
  if (first_source < 0 || first_source >= std::max<int64_t>(num_ranks, 1)) {
    throw std::invalid_argument("ll_canonicalize: first_source " + std::to_string(first_source) + " outside [0, R)");
  }
  check_payload(result.x_bf16, num_local, capacity, "x_bf16");
  check_payload(result.x_fp8, num_local, capacity, "x_fp8");
  check_payload(result.x_scales, num_local, capacity, "x_scales");
  check_payload(result.x_scales_ue8m0, num_local, capacity, "x_scales_ue8m0");

  // Same shapes, every row cleared; valid rows are copied back in canonical order.
  LlRecv out{Tensor3<uint16_t>(result.x_bf16.dim0, result.x_bf16.dim1, result.x_bf16.dim2),
             Tensor3<uint8_t>(result.x_fp8.dim0, result.x_fp8.dim1, result.x_fp8.dim2),
             Tensor3<float>(result.x_scales.dim0, result.x_scales.dim1, result.x_scales.dim2),
             Tensor3<int32_t>(result.x_scales_ue8m0.dim0, result.x_scales_ue8m0.dim1, result.x_scales_ue8m0.dim2),
             result.recv_count,
             Matrix<int32_t>(num_local, capacity, -1),
             Matrix<RowRange>(num_local, num_ranks)};

  for (int64_t e = 0; e < num_local; ++e) {
    const int64_t count = result.recv_count[static_cast<std::size_t>(e)];
    check_ranges(result, e, count, capacity);
    int32_t next = 0;
    for (int64_t position = 0; position < num_ranks; ++position) {
      const int64_t s = (first_source + position) % num_ranks;
      const RowRange range = result.layout_range.at(e, s);
      std::vector<int64_t> rows;  // this block's rows, to be sorted by source token index
      for (int64_t row = range.begin; row < range.begin + range.count; ++row) rows.push_back(row);
      std::sort(rows.begin(), rows.end(),
                [&](int64_t a, int64_t b) { return result.src_idx.at(e, a) < result.src_idx.at(e, b); });
      out.layout_range.at(e, s) = RowRange{next, range.count};
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const int32_t token = result.src_idx.at(e, rows[i]);
        if (token < 0) fail(e, "negative src_idx in the block of source rank " + std::to_string(s));
        if (i > 0 && token == result.src_idx.at(e, rows[i - 1])) {
          fail(e, "token " + std::to_string(token) + " of source rank " + std::to_string(s) + " appears twice");
        }
        out.src_idx.at(e, next) = token;
        move_row(result.x_bf16, out.x_bf16, e, rows[i], next);
        move_row(result.x_fp8, out.x_fp8, e, rows[i], next);
        move_row(result.x_scales, out.x_scales, e, rows[i], next);
        move_row(result.x_scales_ue8m0, out.x_scales_ue8m0, e, rows[i], next);
        ++next;
      }
    }
  }
  return out;
}

LlRecv ll_in_epx_order(const LlRecv& result, int rank) {
  const int64_t num_ranks = result.layout_range.cols;
  return ll_canonicalize(result, num_ranks > 0 ? int((rank + 1) % num_ranks) : 0);
}

int64_t ll_find_row(const LlRecv& result, int64_t local_expert, int src_rank, int64_t src_token) {
  const RowRange range = result.layout_range.at(local_expert, src_rank);
  for (int64_t row = range.begin; row < range.begin + range.count; ++row) {
    if (result.src_idx.at(local_expert, row) == src_token) return row;
  }
  return -1;
}

}  // namespace epx::ref
