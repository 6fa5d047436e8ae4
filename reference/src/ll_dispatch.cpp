// LL dispatch, global form: dedup messages, then their expansion into the packed per-expert layout.
// See ll.hpp for the contract.
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "epx/reference/fp8_cast.hpp"
#include "epx/reference/ll.hpp"
#include "epx/reference/numeric.hpp"

namespace epx::ref {

namespace {

[[noreturn]] void fail(const std::string& message) { throw std::invalid_argument("ll_dispatch: " + message); }

void check_options(const LlDispatchOptions& options, int64_t hidden) {
  if (options.round_scale && !options.use_fp8) fail("round_scale needs use_fp8");
  if (options.use_ue8m0 && !(options.use_fp8 && options.round_scale)) fail("use_ue8m0 needs use_fp8 and round_scale");
  if (options.use_fp8 && hidden % kFp8GroupSize != 0) fail("FP8 hidden size must be a multiple of 128");
  if (options.use_ue8m0 && hidden % (kFp8GroupSize * kUe8m0GroupsPerWord) != 0) {
    fail("UE8M0 hidden size must be a multiple of 512");
  }
}

void check_tokens(std::span<const LlTokens> tokens, const ExpertPlacement& placement, int64_t max_tokens) {
  if (static_cast<int64_t>(tokens.size()) != placement.num_ranks()) fail("expected one input per rank");
  if (max_tokens < 0) fail("max_tokens_per_rank must be >= 0");
  for (std::size_t s = 0; s < tokens.size(); ++s) {
    const LlTokens& in = tokens[s];
    const std::string where = "rank " + std::to_string(s) + ": ";
    if (in.x.rows > max_tokens) fail(where + "more tokens than max_tokens_per_rank");
    if (in.x.cols != tokens[0].x.cols) fail(where + "all ranks must use the same hidden size");
    if (in.topk_idx.rows != in.x.rows) fail(where + "topk_idx must have one row per token");
  }
}

// One source rank's rows as they travel: BF16 bits, or the FP8 cast made once per token.
struct SourcePayload {
  Matrix<uint16_t> bf16;
  Fp8Rows fp8;
  Matrix<int32_t> ue8m0;
};

SourcePayload make_payload(const LlTokens& in, const LlDispatchOptions& options) {
  SourcePayload payload;
  if (!options.use_fp8) {
    payload.bf16 = in.x;
    return payload;
  }
  payload.fp8 = cast_to_fp8(bf16_to_float(in.x), options.round_scale);
  if (options.use_ue8m0) payload.ue8m0 = pack_ue8m0(payload.fp8.scales);
  return payload;
}

template <class T>
void copy_row(const Matrix<T>& from, int64_t from_row, Tensor3<T>& to, int64_t expert, int64_t to_row) {
  for (int64_t c = 0; c < from.cols; ++c) to.at(expert, to_row, c) = from.at(from_row, c);
}

LlRecv empty_recv(const ExpertPlacement& placement, int64_t capacity, int64_t hidden,
                  const LlDispatchOptions& options) {
  const int64_t num_local = placement.experts_per_rank();
  LlRecv out;
  if (!options.use_fp8) {
    out.x_bf16 = Tensor3<uint16_t>(num_local, capacity, hidden, 0);
  } else {
    out.x_fp8 = Tensor3<uint8_t>(num_local, capacity, hidden, 0);
    if (options.use_ue8m0) {
      out.x_scales_ue8m0 = Tensor3<int32_t>(num_local, capacity, hidden / (kFp8GroupSize * kUe8m0GroupsPerWord), 0);
    } else {
      out.x_scales = Tensor3<float>(num_local, capacity, hidden / kFp8GroupSize, 0.0f);
    }
  }
  out.recv_count.assign(static_cast<std::size_t>(num_local), 0);
  out.src_idx = Matrix<int32_t>(num_local, capacity, -1);
  out.layout_range = Matrix<RowRange>(num_local, placement.num_ranks());
  return out;
}

// True if entry i of a message repeats the local expert of an earlier entry.
bool repeats_earlier_entry(const LlMessage& message, std::size_t i) {
  for (std::size_t j = 0; j < i; ++j) {
    if (message.experts[j].local_expert == message.experts[i].local_expert) return true;
  }
  return false;
}

}  // namespace

std::vector<LlMessage> ll_messages(const TopkIdx& topk_idx, const Matrix<float>& topk_weights, int src_rank,
                                   const ExpertPlacement& placement) {
  validate_topk_idx(topk_idx, placement);
  if (topk_weights.rows != topk_idx.rows || topk_weights.cols != topk_idx.cols) {
    throw std::invalid_argument("ll_messages: topk_weights must be [T][K] like topk_idx");
  }
  std::vector<LlMessage> messages;
  for (int64_t t = 0; t < topk_idx.rows; ++t) {
    for (int r = 0; r < placement.num_ranks(); ++r) {
      LlMessage message{src_rank, static_cast<int32_t>(t), r, {}};
      for (int64_t k = 0; k < topk_idx.cols; ++k) {
        const int64_t local = placement.local_id(topk_idx.at(t, k), r);
        if (local != -1) message.experts.push_back({static_cast<int32_t>(local), topk_weights.at(t, k)});
      }
      if (!message.experts.empty()) messages.push_back(std::move(message));
    }
  }
  return messages;
}

std::vector<LlRecv> ll_dispatch(std::span<const LlTokens> tokens, const ExpertPlacement& placement,
                                int64_t max_tokens_per_rank, const LlDispatchOptions& options) {
  check_tokens(tokens, placement, max_tokens_per_rank);
  const int num_ranks = placement.num_ranks();
  const int64_t hidden = tokens[0].x.cols;
  check_options(options, hidden);
  const int64_t capacity = num_ranks * max_tokens_per_rank;

  std::vector<LlRecv> recv;
  for (int r = 0; r < num_ranks; ++r) recv.push_back(empty_recv(placement, capacity, hidden, options));

  for (int s = 0; s < num_ranks; ++s) {  // source ranks ascending: canonical block order
    const LlTokens& in = tokens[static_cast<std::size_t>(s)];
    const SourcePayload payload = make_payload(in, options);
    for (LlRecv& out : recv) {  // every block of s starts where the earlier ranks' blocks end
      for (std::size_t e = 0; e < out.recv_count.size(); ++e) {
        out.layout_range.at(static_cast<int64_t>(e), s).begin = out.recv_count[e];
      }
    }
    // Messages come by token ascending: canonical order inside a block.
    for (const LlMessage& message : ll_messages(in.topk_idx, in.topk_weights, s, placement)) {
      LlRecv& out = recv[static_cast<std::size_t>(message.dst_rank)];
      for (std::size_t i = 0; i < message.experts.size(); ++i) {
        if (repeats_earlier_entry(message, i)) continue;  // one row per distinct expert
        const int64_t e = message.experts[i].local_expert;
        const int64_t row = out.recv_count[static_cast<std::size_t>(e)]++;
        const int64_t t = message.src_token;
        out.src_idx.at(e, row) = message.src_token;
        out.layout_range.at(e, s).count += 1;
        if (!options.use_fp8) {
          copy_row(payload.bf16, t, out.x_bf16, e, row);
        } else {
          copy_row(payload.fp8.values, t, out.x_fp8, e, row);
          if (options.use_ue8m0) {
            copy_row(payload.ue8m0, t, out.x_scales_ue8m0, e, row);
          } else {
            copy_row(payload.fp8.scales, t, out.x_scales, e, row);
          }
        }
      }
    }
  }
  return recv;
}

}  // namespace epx::ref
