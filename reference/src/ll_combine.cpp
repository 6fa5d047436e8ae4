// LL combine, global form, in the naive and the local (per destination rank) summation orders.
// See ll.hpp for the exact orders.
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "epx/reference/layout.hpp"
#include "epx/reference/ll.hpp"
#include "epx/reference/numeric.hpp"

namespace epx::ref {

namespace {

[[noreturn]] void fail(const std::string& message) { throw std::invalid_argument("ll_combine: " + message); }

void check_inputs(std::span<const Tensor3<uint16_t>> y, std::span<const LlRecv> recv, std::span<const TopkIdx> topk_idx,
                  std::span<const Matrix<float>> topk_weights, const ExpertPlacement& placement) {
  const std::size_t num_ranks = static_cast<std::size_t>(placement.num_ranks());
  if (y.size() != num_ranks || recv.size() != num_ranks || topk_idx.size() != num_ranks ||
      topk_weights.size() != num_ranks) {
    fail("expected one y, recv, topk_idx and topk_weights per rank");
  }
  for (std::size_t r = 0; r < num_ranks; ++r) {
    if (y[r].dim0 != placement.experts_per_rank() || y[r].dim1 != recv[r].src_idx.cols || y[r].dim2 != y[0].dim2) {
      fail("y of rank " + std::to_string(r) + " must be [E_local][C][H] like the dispatch layout");
    }
    validate_topk_idx(topk_idx[r], placement);
    if (topk_weights[r].rows != topk_idx[r].rows || topk_weights[r].cols != topk_idx[r].cols) {
      fail("topk_weights of rank " + std::to_string(r) + " must be [T][K] like topk_idx");
    }
  }
}

// Where the expert output for (home rank s, token t, slot k) lives on the expert side.
struct ExpertRow {
  int rank;
  int64_t local_expert;
  int64_t row;
};

ExpertRow find_expert_row(std::span<const LlRecv> recv, const ExpertPlacement& placement, int s, int64_t t,
                          int64_t expert) {
  const int r = placement.rank_of(expert);
  const int64_t local = placement.local_id(expert, r);
  const int64_t row = ll_find_row(recv[static_cast<std::size_t>(r)], local, s, t);
  if (row == -1) {
    fail("no row for token " + std::to_string(t) + " of rank " + std::to_string(s) + " at expert " +
         std::to_string(expert) + " (y does not come from this routing's dispatch)");
  }
  return ExpertRow{r, local, row};
}

struct WeightedRow {
  float weight;
  ExpertRow where;
};

// bf16(acc) with acc = 0.0f; acc = fmaf(weight, float(y at row, column h), acc) over terms in order.
uint16_t fma_chain_bf16(std::span<const Tensor3<uint16_t>> y, const std::vector<WeightedRow>& terms, int64_t h) {
  float acc = 0.0f;
  for (const WeightedRow& term : terms) {
    const ExpertRow& where = term.where;
    const float value = bf16_to_float(y[static_cast<std::size_t>(where.rank)].at(where.local_expert, where.row, h));
    acc = std::fmaf(term.weight, value, acc);
  }
  return float_to_bf16(acc);
}

// naive: one fmaf chain over all slots ascending.
Matrix<uint16_t> combine_naive(std::span<const Tensor3<uint16_t>> y, std::span<const LlRecv> recv,
                               const TopkIdx& topk_idx, const Matrix<float>& topk_weights,
                               const ExpertPlacement& placement, int s) {
  const int64_t hidden = y[0].dim2;
  Matrix<uint16_t> out(topk_idx.rows, hidden, 0);
  for (int64_t t = 0; t < topk_idx.rows; ++t) {
    std::vector<WeightedRow> slots;  // the non-empty slots, in slot order
    for (int64_t k = 0; k < topk_idx.cols; ++k) {
      const int64_t e = topk_idx.at(t, k);
      if (e != -1) slots.push_back({topk_weights.at(t, k), find_expert_row(recv, placement, s, t, e)});
    }
    for (int64_t h = 0; h < hidden; ++h) out.at(t, h) = fma_chain_bf16(y, slots, h);
  }
  return out;
}

}  // namespace

std::vector<Tensor3<uint16_t>> ll_local_partials(std::span<const Tensor3<uint16_t>> y, std::span<const LlRecv> recv,
                                                 std::span<const TopkIdx> topk_idx,
                                                 std::span<const Matrix<float>> topk_weights,
                                                 const ExpertPlacement& placement) {
  check_inputs(y, recv, topk_idx, topk_weights, placement);
  const int64_t hidden = y[0].dim2;
  std::vector<Tensor3<uint16_t>> partials;
  for (int s = 0; s < placement.num_ranks(); ++s) {
    const TopkIdx& idx = topk_idx[static_cast<std::size_t>(s)];
    Tensor3<uint16_t> partial(idx.rows, placement.num_ranks(), hidden, 0);
    // One partial row per dedup message, reduced over the message's entries (= its slots, in order).
    for (const LlMessage& message : ll_messages(idx, topk_weights[static_cast<std::size_t>(s)], s, placement)) {
      const int r = message.dst_rank;
      const int64_t first_expert = static_cast<int64_t>(r) * placement.experts_per_rank();
      std::vector<WeightedRow> terms;  // the message's entries = the token's slots on r, in order
      for (const LlExpertEntry& entry : message.experts) {
        terms.push_back(
            {entry.weight, find_expert_row(recv, placement, s, message.src_token, first_expert + entry.local_expert)});
      }
      for (int64_t h = 0; h < hidden; ++h) partial.at(message.src_token, r, h) = fma_chain_bf16(y, terms, h);
    }
    partials.push_back(std::move(partial));
  }
  return partials;
}

std::vector<Matrix<uint16_t>> ll_combine(std::span<const Tensor3<uint16_t>> y, std::span<const LlRecv> recv,
                                         std::span<const TopkIdx> topk_idx, std::span<const Matrix<float>> topk_weights,
                                         const ExpertPlacement& placement, LlCombineOrder order) {
  check_inputs(y, recv, topk_idx, topk_weights, placement);
  std::vector<Matrix<uint16_t>> outputs;
  if (order == LlCombineOrder::naive) {
    for (int s = 0; s < placement.num_ranks(); ++s) {
      outputs.push_back(combine_naive(y, recv, topk_idx[static_cast<std::size_t>(s)],
                                      topk_weights[static_cast<std::size_t>(s)], placement, s));
    }
    return outputs;
  }
  const std::vector<Tensor3<uint16_t>> partials = ll_local_partials(y, recv, topk_idx, topk_weights, placement);
  const int64_t hidden = y[0].dim2;
  for (int s = 0; s < placement.num_ranks(); ++s) {
    const Layout layout = compute_layout(topk_idx[static_cast<std::size_t>(s)], placement);
    const Tensor3<uint16_t>& partial = partials[static_cast<std::size_t>(s)];
    Matrix<uint16_t> out(partial.dim0, hidden, 0);
    for (int64_t t = 0; t < partial.dim0; ++t) {
      for (int64_t h = 0; h < hidden; ++h) {
        float acc = 0.0f;
        for (int r = 0; r < placement.num_ranks(); ++r) {  // destination ranks ascending
          if (layout.is_token_in_rank.at(t, r) != 0) acc = acc + bf16_to_float(partial.at(t, r, h));
        }
        out.at(t, h) = float_to_bf16(acc);
      }
    }
    outputs.push_back(std::move(out));
  }
  return outputs;
}

}  // namespace epx::ref
