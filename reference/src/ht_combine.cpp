// HT combine, global form. See ht.hpp for the contract and the exact summation order.
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "epx/reference/ht.hpp"
#include "epx/reference/numeric.hpp"

namespace epx::ref {

namespace {

[[noreturn]] void fail(const std::string& message) { throw std::invalid_argument("ht_combine: " + message); }

void check_bias(std::span<const Matrix<uint16_t>> bias, const std::string& name, const HtHandle& handle,
                int64_t hidden) {
  if (bias.empty()) return;
  const std::size_t num_ranks = handle.num_recv_tokens.size();
  if (bias.size() != num_ranks) fail(name + " must be empty or one matrix per home rank");
  for (std::size_t r = 0; r < num_ranks; ++r) {
    if (bias[r].rows != handle.send_row[r].rows || bias[r].cols != hidden) {
      fail("rank " + std::to_string(r) + ": " + name + " must be [T][H]");
    }
  }
}

void check_inputs(std::span<const HtCombineInput> y, const HtHandle& handle, bool with_weights) {
  const std::size_t num_ranks = handle.num_recv_tokens.size();
  if (num_ranks == 0 || y.size() != num_ranks || handle.send_row.size() != num_ranks) {
    fail("expected one input per rank, matching the handle");
  }
  for (std::size_t r = 0; r < num_ranks; ++r) {
    const HtCombineInput& in = y[r];
    const std::string where = "rank " + std::to_string(r) + ": ";
    if (in.y.cols != y[0].y.cols) fail(where + "all ranks must use the same hidden size");
    if (in.y.rows < handle.num_recv_tokens[r]) fail(where + "y has fewer rows than received tokens");
    if ((in.topk_weights.cols > 0) != with_weights) fail(where + "give weights on every rank or on none");
    if (with_weights &&
        (in.topk_weights.rows < handle.num_recv_tokens[r] || in.topk_weights.cols != y[0].topk_weights.cols)) {
      fail(where + "topk_weights must be [rows][K] with the same K on every rank");
    }
  }
}

}  // namespace

std::vector<HtCombineOutput> ht_combine(std::span<const HtCombineInput> y, const HtHandle& handle,
                                        std::span<const Matrix<uint16_t>> bias,
                                        std::span<const Matrix<uint16_t>> second_bias) {
  const bool with_weights = !y.empty() && y[0].topk_weights.cols > 0;
  check_inputs(y, handle, with_weights);
  check_bias(bias, "bias", handle, y[0].y.cols);
  check_bias(second_bias, "second_bias", handle, y[0].y.cols);
  const int num_ranks = static_cast<int>(y.size());
  const int64_t hidden = y[0].y.cols;
  const int64_t topk = with_weights ? y[0].topk_weights.cols : 0;

  std::vector<HtCombineOutput> outputs;
  for (int s = 0; s < num_ranks; ++s) {
    const Matrix<int32_t>& send_row = handle.send_row[static_cast<std::size_t>(s)];
    const int64_t num_tokens = send_row.rows;
    HtCombineOutput out{Matrix<uint16_t>(num_tokens, hidden), Matrix<float>(num_tokens, topk)};
    for (int64_t t = 0; t < num_tokens; ++t) {
      std::vector<std::span<const uint16_t>> rows;  // the token's rows, ranks ascending, then its biases
      for (int r = 0; r < num_ranks; ++r) {
        const int32_t row = send_row.at(t, r);
        if (row != -1) rows.push_back(y[static_cast<std::size_t>(r)].y.row(row));
      }
      if (!bias.empty()) rows.push_back(bias[static_cast<std::size_t>(s)].row(t));
      if (!second_bias.empty()) rows.push_back(second_bias[static_cast<std::size_t>(s)].row(t));
      const std::span<uint16_t> x = out.x.row(t);
      for (int64_t h = 0; h < hidden; ++h) {
        float acc = 0.0f;
        for (const std::span<const uint16_t>& row : rows) acc = acc + bf16_to_float(row[static_cast<std::size_t>(h)]);
        x[static_cast<std::size_t>(h)] = float_to_bf16(acc);
      }
      for (int64_t k = 0; k < topk; ++k) {
        float acc = 0.0f;
        for (int r = 0; r < num_ranks; ++r) {
          const int32_t row = send_row.at(t, r);
          if (row != -1) acc = acc + y[static_cast<std::size_t>(r)].topk_weights.at(row, k);
        }
        out.topk_weights.at(t, k) = acc;
      }
    }
    outputs.push_back(std::move(out));
  }
  return outputs;
}

}  // namespace epx::ref
