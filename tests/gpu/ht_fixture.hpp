// Shared by the HT GPU tests: a case, the whole team's inputs with the reference's outputs, device
// copies, and the checks of a dispatch result against the reference.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "epx/ht.hpp"
#include "epx/reference/ht.hpp"
#include "routing_fixture.hpp"

namespace epx::test {

struct HtCase {
  int single_gpu_ranks;  // 0: one process per GPU (the world team)
  int T, H, K, E;
  Routing routing;
  double p_empty;
  bool fp8;
  bool int32_idx;
  bool column_major_scales;
  int alignment;
  std::string name;
  int num_sms = 0;          // HtConfig::num_sms; 0: the default (a single-GPU team of many ranks needs fewer)
  bool two_biases = false;  // the combine adds a second bias after the first (DeepEP's pair)
};

inline void PrintTo(const HtCase& c, std::ostream* os) { *os << c.name; }

// The whole team's inputs and the reference's outputs, built once per process.
struct Expected {
  int R = 0;
  int E = 0;  // the case's E, or R for kExpertsEqualRanks
  std::vector<ref::HtTokens> tokens;
  ref::HtDispatchResult dispatch;
  std::vector<ref::HtCombineInput> y;
  std::vector<ref::Matrix<uint16_t>> bias;
  std::vector<ref::Matrix<uint16_t>> second_bias;  // empty unless the case has two biases
  std::vector<ref::HtCombineOutput> combine;
};

inline Expected build_expected(const HtCase& c, int R, uint32_t seed) {
  Expected x;
  x.R = R;
  x.E = c.E == kExpertsEqualRanks ? R : c.E;
  const ref::ExpertPlacement placement(x.E, R);
  for (int r = 0; r < R; ++r) {
    std::mt19937 rng = rank_rng(seed, r, 0);
    ref::HtTokens in;
    in.dtype = c.fp8 ? ref::Dtype::fp8 : ref::Dtype::bf16;
    in.topk_idx = make_topk_idx(rng, c.T, c.K, x.E, c.routing, c.p_empty);
    in.topk_weights = make_floats(rng, c.T, c.K, 0.0f, 1.0f);
    if (c.fp8) {
      in.x_fp8 = ref::Matrix<uint8_t>(c.T, c.H);
      for (auto& v : in.x_fp8.data) v = uint8_t(rng());
      in.x_scales = c.column_major_scales ? ref::StridedMatrix<float>::column_major(c.T, c.H / 128)
                                          : ref::StridedMatrix<float>::row_major(c.T, c.H / 128);
      std::uniform_real_distribution<float> scale(0.001f, 2.0f);
      for (auto& v : in.x_scales.data) v = scale(rng);
    } else {
      in.x_bf16 = make_bf16(rng, c.T, c.H);
    }
    x.tokens.push_back(std::move(in));
  }
  x.dispatch = ref::ht_dispatch(x.tokens, placement, ref::HtDispatchOptions{c.alignment, 0});
  for (int r = 0; r < R; ++r) {
    std::mt19937 rng = rank_rng(seed, r, 1);
    const int64_t n = x.dispatch.recv[r].num_recv_tokens;
    x.y.push_back(ref::HtCombineInput{make_bf16(rng, n, c.H), make_floats(rng, n, c.K, -1.0f, 1.0f)});
    x.bias.push_back(make_bf16(rng, c.T, c.H));
    if (c.two_biases) x.second_bias.push_back(make_bf16(rng, c.T, c.H));
  }
  x.combine = ref::ht_combine(x.y, x.dispatch.handle, x.bias, x.second_bias);
  return x;
}

// Copies host memory to the device, complete on return. cudaMemcpy from pageable memory may return
// before its DMA has landed, and it runs on the legacy stream, which the tests' non-blocking streams do
// not wait for; so the legacy stream is synchronised (it waits for no other stream's kernels).
inline void copy_host_to_device(void* device, const void* host, std::size_t bytes) {
  EXPECT_EQ(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(cudaStreamLegacy), cudaSuccess);
}

template <typename T>
void copy_to_device(void* device, const std::vector<T>& host) {
  if (host.empty()) return;
  copy_host_to_device(device, host.data(), host.size() * sizeof(T));
}

// A routing table into device memory, as int32 or as the reference's int64.
inline void copy_topk_to_device(void* device, const ref::Matrix<int64_t>& topk_idx, bool int32) {
  if (int32) {
    copy_to_device(device, std::vector<int32_t>(topk_idx.data.begin(), topk_idx.data.end()));
  } else {
    copy_to_device(device, topk_idx.data);
  }
}

template <typename T>
void copy_from_device(std::vector<T>& host, const void* device) {
  if (host.empty()) return;
  ASSERT_EQ(cudaMemcpy(host.data(), device, host.size() * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
}

// Device copies of a host matrix, freed with the object.
struct DeviceArray {
  void* data = nullptr;
  explicit DeviceArray(std::size_t bytes, const void* host = nullptr) {
    EXPECT_EQ(cudaMalloc(&data, bytes == 0 ? 16 : bytes), cudaSuccess);
    if (host != nullptr && bytes > 0) copy_host_to_device(data, host, bytes);
  }
  ~DeviceArray() { cudaFree(data); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
};

template <typename T>
std::unique_ptr<DeviceArray> upload(const std::vector<T>& v) {
  return std::make_unique<DeviceArray>(v.size() * sizeof(T), v.data());
}

// The rows of a dense [rows][cols] array, each followed by stride - cols zeros (a strided tensor's memory).
template <typename T>
std::vector<T> with_row_stride(const std::vector<T>& dense, int64_t cols, int64_t stride) {
  const int64_t rows = cols == 0 ? 0 : int64_t(dense.size()) / cols;
  std::vector<T> out(std::size_t(rows * stride), T{});
  for (int64_t i = 0; i < rows; ++i) std::copy_n(dense.begin() + i * cols, cols, out.begin() + i * stride);
  return out;
}

template <typename T>
std::vector<T> download(const TensorRef& t) {
  std::vector<T> host(std::size_t(t.rows * t.cols));
  if (host.empty()) return host;
  EXPECT_EQ(element_size(t.type), int(sizeof(T)));
  EXPECT_EQ(cudaMemcpy2D(host.data(), t.cols * sizeof(T), t.data, t.row_stride * sizeof(T), t.cols * sizeof(T), t.rows,
                         cudaMemcpyDeviceToHost),
            cudaSuccess);
  return host;
}

// Waits for a call's stream, then throws for a wait that expired on the way (with masking on, an expired
// wait masks the peer instead and reports nothing), so that a timeout is reported as one and not as
// outputs that were never written. Before every comparison of outputs.
inline void complete(Team& team, cudaStream_t stream) {
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  team.check_device_errors();
}

// Fills an output with a pattern no dispatch writes, in stream order.
inline void poison(const TensorRef& t, cudaStream_t stream) {
  if (t.rows == 0 || t.data == nullptr) return;
  ASSERT_EQ(cudaMemsetAsync(t.data, 0xA5, std::size_t(t.rows) * t.row_stride * element_size(t.type), stream),
            cudaSuccess);
}

// Compares rows [0, rows) of a GPU output with the reference; names the first differing element.
template <typename T>
void expect_rows_equal(const char* what, int rank, const std::vector<T>& got, const std::vector<T>& want, int64_t rows,
                       int64_t cols, const std::vector<int32_t>& src_idx) {
  for (int64_t i = 0; i < rows * cols; ++i) {
    if (got[i] == want[i]) continue;
    const int64_t row = i / cols;
    ADD_FAILURE() << "rank " << rank << ": " << what << "[" << row << "][" << i % cols << "] = " << +got[i] << ", want "
                  << +want[i] << " (row of source token " << (row < int64_t(src_idx.size()) ? src_idx[row] : -2) << ")";
    return;
  }
}

inline std::vector<int64_t> topk_as_int64(const TensorRef& t) {
  if (t.type == ScalarType::int64) return download<int64_t>(t);
  const std::vector<int32_t> narrow = download<int32_t>(t);
  return std::vector<int64_t>(narrow.begin(), narrow.end());
}

// Checks the first `valid` rows of a dispatch result against the reference, and that padding rows
// [valid, rows) say "no token".
inline void check_dispatch(const HtCase& c, int rank, const HtDispatchResult& got, const ref::HtRecv& want,
                           int64_t valid) {
  const int64_t H = c.H, K = c.K;
  const std::vector<int32_t> src = download<int32_t>(got.recv_src_idx);
  const std::vector<int64_t> topk = topk_as_int64(got.recv_topk_idx);
  const std::vector<float> weights = download<float>(got.recv_topk_weights);
  ASSERT_EQ(int64_t(src.size()), got.num_rows);
  expect_rows_equal("recv_src_idx", rank, src, want.src_idx, valid, 1, src);
  expect_rows_equal("recv_topk_idx", rank, topk, want.topk_idx.data, valid, K, src);
  expect_rows_equal("recv_topk_weights", rank, weights, want.topk_weights.data, valid, K, src);
  if (c.fp8) {
    expect_rows_equal("recv_x", rank, download<uint8_t>(got.recv_x), want.x_fp8.data, valid, H, src);
    expect_rows_equal("recv_x_scales", rank, download<float>(got.recv_x_scales), want.x_scales.data, valid, H / 128,
                      src);
  } else {
    expect_rows_equal("recv_x", rank, download<uint16_t>(got.recv_x), want.x_bf16.data, valid, H, src);
  }
  for (int64_t i = valid; i < got.num_rows; ++i) {
    ASSERT_EQ(src[i], -1) << "rank " << rank << ": padding row " << i;
    for (int64_t k = 0; k < K; ++k) {
      ASSERT_EQ(topk[i * K + k], -1) << "rank " << rank << ": padding row " << i;
      ASSERT_EQ(weights[i * K + k], 0.0f) << "rank " << rank << ": padding row " << i;
    }
  }
  EXPECT_EQ(download<int32_t>(got.num_recv_tokens_per_expert), want.num_recv_tokens_per_expert) << "rank " << rank;
}

// The dispatch's count matrix against the reference's routing: [s][d] = rows of source s on rank d.
inline void check_count_matrix(int rank, const HtDispatchResult& got, const ref::HtHandle& want) {
  const int R = int(want.num_recv_tokens.size());
  std::vector<int32_t> expected(std::size_t(R) * R);
  for (int s = 0; s < R; ++s) {
    for (int d = 0; d < R; ++d) expected[s * R + d] = want.recv_count.at(d, s);
  }
  EXPECT_EQ(download<int32_t>(got.count_matrix), expected) << "rank " << rank << ": count_matrix";
}

// One rank's dispatch inputs on the device, sized for `max_tokens` tokens. write_inputs puts a case's
// rows at their front and points `args` at them; the arrays keep their addresses, as a captured graph
// and a loop of calls without allocations (single-GPU teams, see docs/CONTRIBUTING.md) need.
struct RankInputs {
  std::unique_ptr<DeviceArray> x, scales, topk, weights;
  HtDispatchArgs args;
};

inline RankInputs allocate_inputs(int max_tokens, int H, int K) {
  const std::size_t T = std::size_t(max_tokens);
  RankInputs r;
  r.x = std::make_unique<DeviceArray>(T * H * 2);  // BF16, or FP8 in the first half
  r.scales = std::make_unique<DeviceArray>(T * (H / 128) * 4);
  r.topk = std::make_unique<DeviceArray>(T * K * 8);  // int64, or int32 in the first half
  r.weights = std::make_unique<DeviceArray>(T * K * 4);
  return r;
}

inline void write_inputs(const HtCase& c, const ref::HtTokens& in, RankInputs& r) {
  if (c.fp8) {
    copy_to_device(r.x->data, in.x_fp8.data);
  } else {
    copy_to_device(r.x->data, in.x_bf16.data);
  }
  copy_to_device(r.scales->data, in.x_scales.data);
  copy_topk_to_device(r.topk->data, in.topk_idx, c.int32_idx);
  copy_to_device(r.weights->data, in.topk_weights.data);
  HtDispatchArgs& a = r.args;
  a = HtDispatchArgs{};
  a.x = TensorRef::matrix(r.x->data, c.fp8 ? ScalarType::fp8_e4m3 : ScalarType::bf16, c.T, c.H);
  if (c.fp8) {
    a.x_scales =
        TensorRef{r.scales->data, ScalarType::float32, c.T, c.H / 128, in.x_scales.row_stride, in.x_scales.col_stride};
  }
  a.topk_idx = TensorRef::matrix(r.topk->data, c.int32_idx ? ScalarType::int32 : ScalarType::int64, c.T, c.K);
  a.topk_weights = TensorRef::matrix(r.weights->data, ScalarType::float32, c.T, c.K);
  a.expert_alignment = c.alignment;
}

inline RankInputs upload_inputs(const HtCase& c, const ref::HtTokens& in) {
  RankInputs r = allocate_inputs(c.T, c.H, c.K);
  write_inputs(c, in, r);
  return r;
}

// A rank's combine inputs on the device: y and the weights with rows `y_stride` and `w_stride` apart,
// and the biases; `args` combines them once its handle is set (the dispatch's, made after these arrays).
struct CombineInputs {
  std::unique_ptr<DeviceArray> y, weights, bias, second_bias;
  HtCombineArgs args;
};

inline CombineInputs upload_combine_inputs(const HtCase& c, const Expected& x, int rank, int64_t N, int64_t y_stride,
                                           int64_t w_stride) {
  CombineInputs in;
  in.y = upload(with_row_stride(x.y[rank].y.data, c.H, y_stride));
  in.weights = upload(with_row_stride(x.y[rank].topk_weights.data, c.K, w_stride));
  in.bias = upload(x.bias[rank].data);
  in.args.y = TensorRef{in.y->data, ScalarType::bf16, N, c.H, y_stride, 1};
  in.args.topk_weights = TensorRef{in.weights->data, ScalarType::float32, N, c.K, w_stride, 1};
  in.args.bias = TensorRef::matrix(in.bias->data, ScalarType::bf16, c.T, c.H);
  if (c.two_biases) {
    in.second_bias = upload(x.second_bias[rank].data);
    in.args.second_bias = TensorRef::matrix(in.second_bias->data, ScalarType::bf16, c.T, c.H);
  }
  return in;
}

// Checks a combine output of `rank` against the reference.
inline void check_combine(const HtCase& c, int rank, const HtCombineResult& got, const ref::HtCombineOutput& want) {
  const std::vector<int32_t> no_rows;
  expect_rows_equal("combined x", rank, download<uint16_t>(got.x), want.x.data, c.T, c.H, no_rows);
  expect_rows_equal("combined weights", rank, download<float>(got.topk_weights), want.topk_weights.data, c.T, c.K,
                    no_rows);
}

}  // namespace epx::test
