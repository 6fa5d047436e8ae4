// Shared by the LL GPU tests: a case, the whole team's inputs with the reference's outputs, device
// inputs and outputs, and the checks of a dispatch and a combine against the reference.
//
// Every rank rebuilds every rank's inputs from the case seed, so it checks its own outputs against the
// reference of the whole exchange. Dispatch results are copied back into a ref::LlRecv, brought to the
// canonical order by ref::ll_canonicalize and compared bit for bit with the reference; the raw result
// must already be in the order ll.hpp documents (ref::ll_in_epx_order), which is also where the reference's
// combine finds each row of y. Only rows below recv_count are compared: rows past it are not part of the
// contract. Outputs are poisoned before each call, so a row that is not written fails.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "epx/ll.hpp"
#include "epx/reference/ll.hpp"
#include "epx/reference/numeric.hpp"
#include "gpu_test_env.hpp"
#include "ht_fixture.hpp"  // DeviceArray, upload, download, poison, expect_rows_equal
#include "routing_fixture.hpp"
#include "single_gpu_ranks.hpp"  // submit_together

namespace epx::test {

enum class LlPayload { bf16, fp8, fp8_round_scale, fp8_ue8m0 };

struct LlCase {
  int single_gpu_ranks;  // 0: one process per GPU (the world team)
  int T, T_max, H, K, E;
  Routing routing;
  double p_empty;  // probability of a -1 slot
  LlPayload payload;
  bool int32_idx = false;
  bool dispatch_weights = false;     // topk_weights given to dispatch (else the local combine order gets them)
  bool column_major_scales = false;  // DeepEP's scale layout (C * G, 1, C) instead of the default row-major
  bool repeat_slot = false;          // every third token names its first expert again in its last slot
  bool roomy_buffer = false;         // buffer made for hidden 7168 and top-16, larger than the call's H and K
  std::string name;
  int num_sms = 0;         // LlConfig::num_sms (0: the default grid)
  bool special_x = false;  // x holds the FP8 cast's edge cases (put_special_values)
};

inline void PrintTo(const LlCase& c, std::ostream* os) { *os << c.name; }

inline bool uses_fp8(const LlCase& c) { return c.payload != LlPayload::bf16; }
inline bool uses_round_scale(const LlCase& c) {
  return c.payload == LlPayload::fp8_round_scale || c.payload == LlPayload::fp8_ue8m0;
}
inline bool uses_ue8m0(const LlCase& c) { return c.payload == LlPayload::fp8_ue8m0; }

// The team a case runs on: the world team's size, or its single-GPU rank count.
inline int team_size(const LlCase& c) { return c.single_gpu_ranks == 0 ? rank_info().world_size : c.single_gpu_ranks; }

// Small enough to check every call; H = 512 allows UE8M0, E = 32 divides among 2, 4 and 8 ranks.
inline LlCase ll_small_case(int single_gpu_ranks) {
  return LlCase{.single_gpu_ranks = single_gpu_ranks,
                .T = 16,
                .T_max = 16,
                .H = 512,
                .K = 4,
                .E = 32,
                .routing = Routing::uniform,
                .p_empty = 0.1,
                .payload = LlPayload::fp8,
                .dispatch_weights = true,
                .name = "small"};
}

// The whole team's inputs and the reference's outputs.
struct LlExpected {
  int R = 0, E = 0, E_local = 0;
  int64_t C = 0;                                            // rows per local expert: R * T_max
  std::vector<ref::LlTokens> tokens;                        // per rank: x, topk_idx and the dispatch's weights
  std::vector<ref::Matrix<float>> combine_weights;          // per rank: the weights given to combine: the naive
                                                            // order's, and the local order's without dispatch
                                                            // weights (other values than the dispatch's)
  std::vector<ref::Tensor3<uint16_t>> y;                    // per rank: the experts' outputs [E_local][C][H],
                                                            // rows as the dispatch lays them out (ll.hpp)
  std::vector<ref::LlRecv> recv;                            // per rank, canonical order
  std::vector<ref::Matrix<uint16_t>> out_local, out_naive;  // per rank [T][H]
};

// y: random BF16 from a hash of (key, element), cheap enough for hundreds of millions of elements.
// Sign and mantissa are random, the exponent gives magnitudes in [2^-4, 2^2): never zero, never large.
inline ref::Tensor3<uint16_t> make_hashed_bf16(int64_t d0, int64_t d1, int64_t d2, uint64_t key) {
  ref::Tensor3<uint16_t> t(d0, d1, d2);
  for (std::size_t i = 0; i < t.data.size(); ++i) {
    uint64_t z = key + (i + 1) * 0x9E3779B97F4A7C15ull;  // splitmix64
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const uint32_t exponent = 123u + uint32_t((z >> 8) % 6u);  // 2^-4 .. 2^1
    t.data[i] = uint16_t(((z >> 16) & 0x8000u) | (exponent << 7) | (z & 0x7Fu));
  }
  return t;
}

// The FP8 cast's edge cases, in one 128-column group of each token t (group t % groups), by t % 5: a
// group of NaNs (both signs); an infinity of each sign among random values (scale and products not
// finite); a group of zeros (both signs) and subnormals (amax below the floor); NaNs and the largest
// finite BF16 among random values; the group as drawn.
inline void put_special_values(ref::Matrix<uint16_t>& x) {
  const int64_t groups = x.cols / 128;
  for (int64_t t = 0; t < x.rows; ++t) {
    uint16_t* group = &x.at(t, (t % groups) * 128);
    const int kind = int(t % 5);
    for (int i = 0; i < 128; ++i) {
      const uint16_t sign = (i & 1) != 0 ? 0x8000u : 0u;
      if (kind == 0) group[i] = uint16_t(sign | 0x7FC0u);
      if (kind == 1 && (i == 5 || i == 70)) group[i] = uint16_t(sign | 0x7F80u);
      if (kind == 2) group[i] = uint16_t(sign | (i % 3 == 0 ? 0 : i));  // exponent 0: zero or subnormal
      if (kind == 3 && i % 9 == 0) group[i] = i % 2 == 0 ? uint16_t(0x7FC1u) : uint16_t(sign | 0x7F7Fu);
    }
  }
}

// Inputs only (tokens, weights, y); compute_ll_reference adds the reference's outputs. Split so a test
// can edit the inputs the reference sees (an invalid id becomes -1) before computing it.
inline LlExpected make_ll_inputs(const LlCase& c, int R, uint32_t seed) {
  LlExpected x;
  x.R = R;
  x.E = c.E == kExpertsEqualRanks ? R : c.E;
  x.E_local = x.E / R;
  x.C = int64_t(R) * c.T_max;
  for (int r = 0; r < R; ++r) {
    std::mt19937 rng = rank_rng(seed, r, 0);
    ref::LlTokens in;
    in.x = make_bf16(rng, c.T, c.H);
    if (c.special_x) put_special_values(in.x);
    in.topk_idx = make_topk_idx(rng, c.T, c.K, x.E, c.routing, c.p_empty);
    in.topk_weights = make_floats(rng, c.T, c.K, 0.0f, 1.0f);
    if (c.repeat_slot && c.K >= 2) {
      for (int t = 1; t < c.T; t += 3) in.topk_idx.at(t, c.K - 1) = in.topk_idx.at(t, 0);
    }
    x.tokens.push_back(std::move(in));
    std::mt19937 other = rank_rng(seed, r, 1);
    x.combine_weights.push_back(make_floats(other, c.T, c.K, -1.0f, 1.0f));
    x.y.push_back(make_hashed_bf16(x.E_local, x.C, c.H, (uint64_t(seed) << 8) + uint64_t(r)));
  }
  return x;
}

inline void compute_ll_reference(const LlCase& c, LlExpected& x) {
  const ref::ExpertPlacement placement(x.E, x.R);
  x.recv = ref::ll_dispatch(x.tokens, placement, c.T_max,
                            ref::LlDispatchOptions{uses_fp8(c), uses_round_scale(c), uses_ue8m0(c)});
  std::vector<ref::TopkIdx> idx;
  std::vector<ref::Matrix<float>> weights;  // the local order's: the dispatch's, else the combine's
  for (int r = 0; r < x.R; ++r) {
    idx.push_back(x.tokens[r].topk_idx);
    weights.push_back(c.dispatch_weights ? x.tokens[r].topk_weights : x.combine_weights[r]);
  }
  // The combine reads y's rows where the dispatch put each (s, t): ll.hpp's order, not the canonical one.
  std::vector<ref::LlRecv> laid_out;
  for (int r = 0; r < x.R; ++r) laid_out.push_back(ref::ll_in_epx_order(x.recv[r], r));
  x.out_local = ref::ll_combine(x.y, laid_out, idx, weights, placement, ref::LlCombineOrder::local);
  x.out_naive = ref::ll_combine(x.y, laid_out, idx, x.combine_weights, placement, ref::LlCombineOrder::naive);
}

inline LlExpected build_ll_expected(const LlCase& c, int R, uint32_t seed) {
  LlExpected x = make_ll_inputs(c, R, seed);
  compute_ll_reference(c, x);
  return x;
}

inline LlBufferOptions ll_buffer_options(const LlCase& c, const LlExpected& x) {
  return LlBufferOptions{c.T_max, c.roomy_buffer ? 7168 : c.H, c.roomy_buffer ? 16 : c.K, x.E};
}

// Every case's combine runs in both orders (the local one with the weights given to dispatch, or
// without dispatch weights with those given to combine).
inline constexpr LlCombineOrder kLlOrders[] = {LlCombineOrder::local, LlCombineOrder::naive};

inline const char* order_name(LlCombineOrder order) {
  return order == LlCombineOrder::local ? "combine out (local order)" : "combine out (naive order)";
}

// One rank's inputs on the device. The arrays keep their addresses when new inputs are written into
// them (write_ll_inputs), as a captured graph needs.
struct LlRankInputs {
  std::unique_ptr<DeviceArray> x, topk_idx, dispatch_weights, combine_weights, y;
};

inline void write_ll_inputs(const LlCase& c, const LlExpected& x, int rank, const LlRankInputs& in) {
  const ref::LlTokens& t = x.tokens[rank];
  copy_to_device(in.x->data, t.x.data);
  copy_topk_to_device(in.topk_idx->data, t.topk_idx, c.int32_idx);
  copy_to_device(in.dispatch_weights->data, t.topk_weights.data);
  copy_to_device(in.combine_weights->data, x.combine_weights[rank].data);
  copy_to_device(in.y->data, x.y[rank].data);
}

inline LlRankInputs upload_ll_inputs(const LlCase& c, const LlExpected& x, int rank) {
  const std::size_t slots = std::size_t(c.T) * c.K;
  LlRankInputs in;
  in.x = std::make_unique<DeviceArray>(std::size_t(c.T) * c.H * 2);
  in.topk_idx = std::make_unique<DeviceArray>(slots * (c.int32_idx ? 4 : 8));
  in.dispatch_weights = std::make_unique<DeviceArray>(slots * 4);
  in.combine_weights = std::make_unique<DeviceArray>(slots * 4);
  in.y = std::make_unique<DeviceArray>(std::size_t(x.E_local) * x.C * c.H * 2);
  write_ll_inputs(c, x, rank, in);
  return in;
}

// The packed dispatch outputs and combine's out, sized by LlBuffer::output_bytes.
struct LlOutputs {
  LlBuffer::OutputBytes bytes{};
  std::unique_ptr<DeviceArray> x, scales, recv_count, src_idx, layout_range, combined;
  LlDispatchOutputs view;      // what dispatch writes
  LlScalesLayout scales_read;  // the scales' strides in elements, resolved (never all zero)
  TensorRef out;               // combine's out [T][H] bf16
};

inline LlOutputs allocate_ll_outputs(const LlCase& c, const LlExpected& x, const LlBuffer& buffer) {
  LlOutputs o;
  o.bytes = buffer.output_bytes(uses_fp8(c), uses_ue8m0(c), c.H);
  const int64_t G = uses_ue8m0(c) ? c.H / 512 : c.H / 128;
  const std::size_t rows = std::size_t(x.E_local) * x.C;
  // Below these sizes the GPU would write past the caller's allocation.
  EXPECT_GE(o.bytes.x, rows * c.H * (uses_fp8(c) ? 1 : 2));
  if (uses_fp8(c)) {
    EXPECT_GE(o.bytes.scales, rows * G * 4);
  }
  EXPECT_GE(o.bytes.recv_count, std::size_t(x.E_local) * 4);
  EXPECT_GE(o.bytes.src_idx, rows * 4);
  EXPECT_GE(o.bytes.layout_range, std::size_t(x.E_local) * x.R * sizeof(LlRange));
  o.x = std::make_unique<DeviceArray>(o.bytes.x);
  o.scales = std::make_unique<DeviceArray>(o.bytes.scales);
  o.recv_count = std::make_unique<DeviceArray>(o.bytes.recv_count);
  o.src_idx = std::make_unique<DeviceArray>(o.bytes.src_idx);
  o.layout_range = std::make_unique<DeviceArray>(o.bytes.layout_range);
  o.combined = std::make_unique<DeviceArray>(std::size_t(c.T) * c.H * 2);
  o.view.x = o.x->data;
  o.view.scales = uses_fp8(c) ? o.scales->data : nullptr;
  o.view.recv_count = static_cast<int32_t*>(o.recv_count->data);
  o.view.src_idx = static_cast<int32_t*>(o.src_idx->data);
  o.view.layout_range = static_cast<LlRange*>(o.layout_range->data);
  o.scales_read = LlScalesLayout{x.C * G, G, 1};
  if (c.column_major_scales) o.view.scales_layout = o.scales_read = LlScalesLayout{x.C * G, 1, x.C};
  o.out = TensorRef::matrix(o.combined->data, ScalarType::bf16, c.T, c.H);
  return o;
}

// Fills every output with a pattern no call writes (0xA5 bytes: negative counts and indices), in
// stream order.
inline void poison_ll_outputs(const LlOutputs& o, cudaStream_t stream) {
  const std::pair<const DeviceArray*, std::size_t> areas[] = {
      {o.x.get(), o.bytes.x},
      {o.scales.get(), o.bytes.scales},
      {o.recv_count.get(), o.bytes.recv_count},
      {o.src_idx.get(), o.bytes.src_idx},
      {o.layout_range.get(), o.bytes.layout_range},
      {o.combined.get(), std::size_t(o.out.rows) * o.out.cols * 2}};
  for (const auto& [area, bytes] : areas) {
    if (bytes > 0) {
      ASSERT_EQ(cudaMemsetAsync(area->data, 0xA5, bytes, stream), cudaSuccess);
    }
  }
}

inline LlDispatchArgs ll_dispatch_args(const LlCase& c, const LlRankInputs& in, const LlOutputs& out) {
  LlDispatchArgs a;
  a.x = TensorRef::matrix(in.x->data, ScalarType::bf16, c.T, c.H);
  a.topk_idx = TensorRef::matrix(in.topk_idx->data, c.int32_idx ? ScalarType::int32 : ScalarType::int64, c.T, c.K);
  if (c.dispatch_weights) a.topk_weights = TensorRef::matrix(in.dispatch_weights->data, ScalarType::float32, c.T, c.K);
  a.use_fp8 = uses_fp8(c);
  a.round_scale = uses_round_scale(c);
  a.use_ue8m0 = uses_ue8m0(c);
  a.out = out.view;
  return a;
}

// y is the rank's whole packed [E_local * C][H]; the naive order gets the combine weights, and so does
// the local order where the dispatch had none.
inline LlCombineArgs ll_combine_args(const LlCase& c, const LlExpected& x, const LlRankInputs& in, const LlOutputs& out,
                                     const LlHandle& handle, LlCombineOrder order) {
  LlCombineArgs a;
  a.y = TensorRef::matrix(in.y->data, ScalarType::bf16, int64_t(x.E_local) * x.C, c.H);
  if (order == LlCombineOrder::naive || !c.dispatch_weights) {
    a.topk_weights = TensorRef::matrix(in.combine_weights->data, ScalarType::float32, c.T, c.K);
  }
  a.handle = handle;
  a.order = order;
  a.out = out.out;
  return a;
}

// The scales as ref::Tensor3 [E_local][C][G], read through the output's strides.
template <typename T>
ref::Tensor3<T> download_scales(const LlOutputs& o, int64_t num_local, int64_t C, int64_t G) {
  std::vector<T> flat(o.bytes.scales / sizeof(T));
  copy_from_device(flat, o.scales->data);
  ref::Tensor3<T> t(num_local, C, G);
  const LlScalesLayout& s = o.scales_read;
  for (int64_t e = 0; e < num_local; ++e) {
    for (int64_t row = 0; row < C; ++row) {
      for (int64_t g = 0; g < G; ++g) {
        t.at(e, row, g) = flat.at(e * s.expert_stride + row * s.row_stride + g * s.col_stride);
      }
    }
  }
  return t;
}

// The GPU's dispatch outputs as the reference's LlRecv, in the order the GPU wrote them.
inline ref::LlRecv download_recv(const LlCase& c, const LlExpected& x, const LlOutputs& o) {
  const int64_t n = x.E_local, C = x.C, H = c.H;
  ref::LlRecv r;
  r.recv_count.assign(std::size_t(n), 0);
  copy_from_device(r.recv_count, o.view.recv_count);
  r.src_idx = ref::Matrix<int32_t>(n, C);
  copy_from_device(r.src_idx.data, o.view.src_idx);
  std::vector<LlRange> ranges(std::size_t(n) * x.R);
  copy_from_device(ranges, o.view.layout_range);
  r.layout_range = ref::Matrix<ref::RowRange>(n, x.R);
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    r.layout_range.data[i] = ref::RowRange{ranges[i].begin, ranges[i].count};
  }
  if (!uses_fp8(c)) {
    r.x_bf16 = ref::Tensor3<uint16_t>(n, C, H);
    copy_from_device(r.x_bf16.data, o.view.x);
    return r;
  }
  r.x_fp8 = ref::Tensor3<uint8_t>(n, C, H);
  copy_from_device(r.x_fp8.data, o.view.x);
  if (uses_ue8m0(c)) {
    r.x_scales_ue8m0 = download_scales<int32_t>(o, n, C, H / 512);
  } else {
    r.x_scales = download_scales<float>(o, n, C, H / 128);
  }
  return r;
}

// "source rank s, token t" of a row, from the result's ranges.
inline std::string row_source(const ref::LlRecv& r, int64_t e, int64_t row) {
  for (int64_t s = 0; s < r.layout_range.cols; ++s) {
    const ref::RowRange range = r.layout_range.at(e, s);
    if (row >= range.begin && row < range.begin + range.count) {
      return "source rank " + std::to_string(s) + ", token " + std::to_string(r.src_idx.at(e, row));
    }
  }
  return "no source";
}

// Rows [0, rows) of local expert e: bit-equal, or one failure naming the first differing element.
template <typename T>
bool same_payload_rows(const std::string& what, const char* name, const ref::Tensor3<T>& got,
                       const ref::Tensor3<T>& want, int64_t e, int64_t rows, const ref::LlRecv& want_recv) {
  if (got.dim2 != want.dim2 || got.data.empty() != want.data.empty()) {
    ADD_FAILURE() << what << ": " << name << " has " << got.dim2 << " columns, want " << want.dim2;
    return false;
  }
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t col = 0; col < want.dim2; ++col) {
      const T& a = got.at(e, row, col);
      const T& b = want.at(e, row, col);
      if (std::memcmp(&a, &b, sizeof(T)) == 0) continue;
      ADD_FAILURE() << what << ": local expert " << e << " row " << row << " (" << row_source(want_recv, e, row)
                    << "): " << name << "[" << col << "] = " << +a << ", want " << +b;
      return false;
    }
  }
  return true;
}

// Compares the rows below recv_count of two results; `what` names the rank and the comparison. An empty
// range's begin is not compared (ll.hpp does not say what it is). Reports the first difference only.
inline bool same_recv(const std::string& what, const ref::LlRecv& got, const ref::LlRecv& want) {
  if (got.recv_count != want.recv_count) {
    for (std::size_t e = 0; e < want.recv_count.size(); ++e) {
      if (got.recv_count[e] == want.recv_count[e]) continue;
      ADD_FAILURE() << what << ": local expert " << e << ": recv_count = " << got.recv_count[e] << ", want "
                    << want.recv_count[e];
      break;
    }
    return false;
  }
  for (int64_t e = 0; e < int64_t(want.recv_count.size()); ++e) {
    for (int64_t s = 0; s < want.layout_range.cols; ++s) {
      const ref::RowRange a = got.layout_range.at(e, s), b = want.layout_range.at(e, s);
      if (a.count == b.count && (a.count == 0 || a.begin == b.begin)) continue;
      ADD_FAILURE() << what << ": local expert " << e << ": layout_range[" << s << "] = (" << a.begin << ", " << a.count
                    << "), want (" << b.begin << ", " << b.count << ")";
      return false;
    }
    const int64_t rows = want.recv_count[std::size_t(e)];
    for (int64_t row = 0; row < rows; ++row) {
      if (got.src_idx.at(e, row) == want.src_idx.at(e, row)) continue;
      ADD_FAILURE() << what << ": local expert " << e << " row " << row << ": src_idx = " << got.src_idx.at(e, row)
                    << ", want " << want.src_idx.at(e, row) << " (" << row_source(want, e, row) << ")";
      return false;
    }
    const bool same = same_payload_rows(what, "x", got.x_bf16, want.x_bf16, e, rows, want) &&
                      same_payload_rows(what, "x", got.x_fp8, want.x_fp8, e, rows, want) &&
                      same_payload_rows(what, "scales", got.x_scales, want.x_scales, e, rows, want) &&
                      same_payload_rows(what, "ue8m0 scales", got.x_scales_ue8m0, want.x_scales_ue8m0, e, rows, want);
    if (!same) return false;
  }
  return true;
}

// Scale `byte` (0..3) of a UE8M0 word: the byte is the float's biased exponent (fp8_cast.hpp).
inline float ue8m0_scale(int32_t word, int64_t byte) {
  return ref::bits_to_float(((uint32_t(word) >> (8 * byte)) & 0xFFu) << 23);
}

// The FP8 rows, dequantised, against the BF16 input they came from. E4M3 keeps 3 mantissa bits: the
// error is at most 2^-4 of the value, or 2^-10 * scale in the subnormal range; the bound has margin.
// A wrong scale or a row of another token fails it.
inline void expect_fp8_close_to_input(const LlCase& c, const LlExpected& x, int rank, const ref::LlRecv& got) {
  for (int64_t e = 0; e < x.E_local; ++e) {
    for (int s = 0; s < x.R; ++s) {
      const ref::RowRange range = got.layout_range.at(e, s);
      for (int64_t row = range.begin; row < range.begin + range.count; ++row) {
        const int64_t t = got.src_idx.at(e, row);
        for (int64_t h = 0; h < c.H; ++h) {
          const int64_t g = h / 128;
          const float scale =
              uses_ue8m0(c) ? ue8m0_scale(got.x_scales_ue8m0.at(e, row, g / 4), g % 4) : got.x_scales.at(e, row, g);
          // In double: 2^120 (the scale of a group holding the largest BF16) times 256 exceeds a float.
          const double value = double(ref::e4m3_to_float(got.x_fp8.at(e, row, h))) * scale;
          const float input = ref::bf16_to_float(x.tokens[s].x.at(t, h));
          if (!std::isfinite(input) || !std::isfinite(scale)) continue;  // special_x: the reference's bits decide
          if (std::fabs(value - input) <= std::fabs(input) * 0.07 + scale * 0.002) continue;
          ADD_FAILURE() << "rank " << rank << ": local expert " << e << " row " << row << " (source rank " << s
                        << ", token " << t << "): column " << h << " dequantises to " << value << ", input " << input
                        << " (scale " << scale << ")";
          return;
        }
      }
    }
  }
}

// Checks a dispatch's outputs (stream synchronised) against the reference.
inline void check_ll_dispatch(const LlCase& c, const LlExpected& x, int rank, const LlOutputs& o) {
  const std::string who = "rank " + std::to_string(rank);
  const ref::LlRecv raw = download_recv(c, x, o);
  ref::LlRecv got;
  try {
    got = ref::ll_canonicalize(raw);
  } catch (const std::exception& e) {
    ADD_FAILURE() << who << ": the dispatch result is not a valid packed layout: " << e.what();
    return;
  }
  if (!same_recv(who + ": dispatch vs reference", got, x.recv[rank])) return;
  same_recv(who +
                ": dispatch rows not in the documented order (source blocks from rank + 1 up, wrapping, the rank's "
                "own last; tokens ascending)",
            raw, ref::ll_in_epx_order(raw, rank));
  if (uses_fp8(c)) expect_fp8_close_to_input(c, x, rank, got);
}

// Checks combine's out (stream synchronised) against the reference of `order`, bit for bit.
inline void check_ll_combine(const LlCase& c, const LlExpected& x, int rank, const LlOutputs& o, LlCombineOrder order) {
  const ref::Matrix<uint16_t>& want = (order == LlCombineOrder::local ? x.out_local : x.out_naive)[rank];
  std::vector<int32_t> tokens(std::size_t(c.T));
  for (int t = 0; t < c.T; ++t) tokens[std::size_t(t)] = t;
  expect_rows_equal(order_name(order), rank, download<uint16_t>(o.out), want.data, c.T, c.H, tokens);
}

// The exchange as a rank that masks `masked` sees it: their experts are -1 in every rank's top-k, and
// their own tokens name no expert.
inline LlExpected ll_masked_expected(const LlCase& c, int R, uint32_t seed, const std::vector<bool>& masked) {
  LlExpected x = make_ll_inputs(c, R, seed);
  for (int r = 0; r < R; ++r) {
    for (int64_t& e : x.tokens[r].topk_idx.data) {
      if (masked[r] || (e >= 0 && masked[e / x.E_local])) e = -1;
    }
  }
  compute_ll_reference(c, x);
  return x;
}

// One dispatch (its handle checked too) and one combine per order on this rank, with `in` holding `want`'s inputs,
// checked against `want` (this rank's outputs only), each call first completed (complete: an expired wait is
// reported as one). Nothing is allocated or freed here: on a single-GPU team a cudaFree waits for every kernel
// of the GPU, other ranks' included, which may be waiting for this rank; and each call is submitted together
// with the other ranks' (single_gpu_ranks.hpp).
inline void ll_exchange_and_check(const LlCase& c, const LlExpected& want, LlBuffer& buffer, Team& team,
                                  const LlRankInputs& in, const LlOutputs& out, cudaStream_t stream) {
  const int rank = team.rank();
  poison_ll_outputs(out, stream);
  const LlDispatchResult d =
      submit_together([&] { return buffer.dispatch(ll_dispatch_args(c, in, out), Streams{stream}); });
  ASSERT_NO_FATAL_FAILURE(complete(team, stream));
  EXPECT_EQ(d.handle.buffer, &buffer) << "rank " << rank;
  EXPECT_EQ(d.handle.num_tokens, c.T) << "rank " << rank;
  EXPECT_EQ(d.handle.topk, c.K) << "rank " << rank;
  EXPECT_EQ(d.handle.hidden, c.H) << "rank " << rank;
  EXPECT_EQ(d.handle.has_weights, c.dispatch_weights) << "rank " << rank;
  check_ll_dispatch(c, want, rank, out);
  for (const LlCombineOrder order : kLlOrders) {
    poison(out.out, stream);
    submit_together([&] { buffer.combine(ll_combine_args(c, want, in, out, d.handle, order), Streams{stream}); });
    ASSERT_NO_FATAL_FAILURE(complete(team, stream));
    check_ll_combine(c, want, rank, out, order);
  }
}

}  // namespace epx::test
