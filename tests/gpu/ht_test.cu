// HT dispatch and combine against the CPU reference: exact, worst-case and cached forms, BF16 and FP8,
// int64 and int32 routing, weights and bias, on one process per GPU and on one GPU with 2, 4, 8 ranks.
// Every rank rebuilds the whole team's inputs from the case seed, so it checks its own outputs against
// the reference of the whole exchange, bit for bit (combine too: the GPU adds ranks in the reference's
// order). Outputs are poisoned before the second and third dispatch, so a row that is not written fails.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include "epx/ht.hpp"
#include "epx/reference/ht.hpp"
#include "gpu_test_env.hpp"
#include "routing_fixture.hpp"
#include "single_gpu_ranks.hpp"

namespace epx::test {
namespace {

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
};

void PrintTo(const HtCase& c, std::ostream* os) { *os << c.name; }

// The whole team's inputs and the reference's outputs, built once per process.
struct Expected {
  int R = 0;
  std::vector<ref::HtTokens> tokens;
  ref::HtDispatchResult dispatch;
  std::vector<ref::HtCombineInput> y;
  std::vector<ref::Matrix<uint16_t>> bias;
  std::vector<ref::HtCombineOutput> combine;
};

Expected build_expected(const HtCase& c, int R, uint32_t seed) {
  Expected x;
  x.R = R;
  const ref::ExpertPlacement placement(c.E, R);
  for (int r = 0; r < R; ++r) {
    std::mt19937 rng = rank_rng(seed, r, 0);
    ref::HtTokens in;
    in.dtype = c.fp8 ? ref::Dtype::fp8 : ref::Dtype::bf16;
    in.topk_idx = make_topk_idx(rng, c.T, c.K, c.E, c.routing, c.p_empty);
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
  }
  x.combine = ref::ht_combine(x.y, x.dispatch.handle, x.bias);
  return x;
}

// Device copies of a host matrix, freed with the object.
struct DeviceArray {
  void* data = nullptr;
  explicit DeviceArray(std::size_t bytes, const void* host = nullptr) {
    EXPECT_EQ(cudaMalloc(&data, bytes == 0 ? 16 : bytes), cudaSuccess);
    if (host != nullptr && bytes > 0) EXPECT_EQ(cudaMemcpy(data, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceArray() { cudaFree(data); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
};

template <typename T>
std::unique_ptr<DeviceArray> upload(const std::vector<T>& v) {
  return std::make_unique<DeviceArray>(v.size() * sizeof(T), v.data());
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

// Fills an output with a pattern no dispatch writes, in stream order.
void poison(const TensorRef& t, cudaStream_t stream) {
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

std::vector<int64_t> topk_as_int64(const TensorRef& t) {
  if (t.type == ScalarType::int64) return download<int64_t>(t);
  const std::vector<int32_t> narrow = download<int32_t>(t);
  return std::vector<int64_t>(narrow.begin(), narrow.end());
}

// Checks the first `valid` rows of a dispatch result against the reference, and that padding rows
// [valid, rows) say "no token".
void check_dispatch(const HtCase& c, int rank, const HtDispatchResult& got, const ref::HtRecv& want, int64_t valid) {
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

void run_rank(const HtCase& c, const Expected& x, Team& team, cudaStream_t stream) {
  const int rank = team.rank();
  const ref::HtTokens& in = x.tokens[rank];
  const ref::HtRecv& want = x.dispatch.recv[rank];
  const int64_t N = want.num_recv_tokens;

  // Inputs on the device.
  auto d_x = c.fp8 ? upload(in.x_fp8.data) : upload(in.x_bf16.data);
  auto d_scales = upload(in.x_scales.data);
  std::vector<int32_t> topk32(in.topk_idx.data.begin(), in.topk_idx.data.end());
  auto d_topk = c.int32_idx ? upload(topk32) : upload(in.topk_idx.data);
  auto d_weights = upload(in.topk_weights.data);
  HtDispatchArgs args;
  args.x = TensorRef::matrix(d_x->data, c.fp8 ? ScalarType::fp8_e4m3 : ScalarType::bf16, c.T, c.H);
  if (c.fp8) {
    args.x_scales =
        TensorRef{d_scales->data, ScalarType::float32, c.T, c.H / 128, in.x_scales.row_stride, in.x_scales.col_stride};
  }
  args.topk_idx = TensorRef::matrix(d_topk->data, c.int32_idx ? ScalarType::int32 : ScalarType::int64, c.T, c.K);
  args.topk_weights = TensorRef::matrix(d_weights->data, ScalarType::float32, c.T, c.K);
  args.expert_alignment = c.alignment;

  HtBuffer buffer(team, HtBufferOptions{std::max(c.T, 1), c.H, c.K, c.E});
  const HtStreams on{stream};

  // 1. Exact form.
  // Outputs are complete in stream order (the exact form returns once N is known, not once rows landed),
  // so every check below synchronises the stream first.
  const HtDispatchResult exact = buffer.dispatch(args, on);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ASSERT_EQ(exact.num_recv_tokens, N) << "rank " << rank;
  EXPECT_EQ(exact.num_recv_tokens_per_expert_host, want.num_recv_tokens_per_expert) << "rank " << rank;
  check_dispatch(c, rank, exact, want, N);

  // 2. Worst-case form, outputs poisoned first.
  poison(exact.recv_x, stream);
  poison(exact.recv_src_idx, stream);
  poison(exact.recv_topk_idx, stream);
  poison(exact.recv_topk_weights, stream);
  if (c.fp8) poison(exact.recv_x_scales, stream);
  HtDispatchArgs worst = args;
  worst.num_worst_tokens = int64_t(x.R) * std::max(c.T, 1);
  const HtDispatchResult padded = buffer.dispatch(worst, on);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(padded.num_rows, worst.num_worst_tokens);
  check_dispatch(c, rank, padded, want, N);

  // 3. Cached form with the exact form's handle, outputs poisoned first.
  poison(padded.recv_x, stream);
  poison(padded.recv_src_idx, stream);
  HtDispatchArgs cached = args;
  cached.cached = exact.handle;
  const HtDispatchResult again = buffer.dispatch(cached, on);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ASSERT_EQ(again.num_recv_tokens, N);
  check_dispatch(c, rank, again, want, N);

  // 4. Combine with weights and bias, through the exact form's handle.
  auto d_y = upload(x.y[rank].y.data);
  auto d_yw = upload(x.y[rank].topk_weights.data);
  auto d_bias = upload(x.bias[rank].data);
  HtCombineArgs combine;
  combine.y = TensorRef::matrix(d_y->data, ScalarType::bf16, N, c.H);
  combine.topk_weights = TensorRef::matrix(d_yw->data, ScalarType::float32, N, c.K);
  combine.bias = TensorRef::matrix(d_bias->data, ScalarType::bf16, c.T, c.H);
  combine.handle = exact.handle;
  const HtCombineResult out = buffer.combine(combine, on);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  team.check_device_errors();
  const std::vector<int32_t> identity;
  expect_rows_equal("combined x", rank, download<uint16_t>(out.x), x.combine[rank].x.data, c.T, c.H, identity);
  expect_rows_equal("combined weights", rank, download<float>(out.topk_weights), x.combine[rank].topk_weights.data, c.T,
                    c.K, identity);
}

class HtExchange : public ::testing::TestWithParam<HtCase> {};

TEST_P(HtExchange, MatchesReference) {
  const HtCase& c = GetParam();
  const uint32_t seed = uint32_t(std::hash<std::string>{}(c.name));
  if (c.single_gpu_ranks == 0) {
    EPX_REQUIRE_WORLD_SIZE(2);
    Team& team = world_team();
    const Expected x = build_expected(c, team.size(), seed);
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    run_rank(c, x, team, stream);
    cudaStreamDestroy(stream);
    return;
  }
  const Expected x = build_expected(c, c.single_gpu_ranks, seed);
  on_single_gpu_team(c.single_gpu_ranks, TeamOptions{},
                     [&](Team& team, cudaStream_t stream) { run_rank(c, x, team, stream); });
}

std::vector<HtCase> cases() {
  using Rt = Routing;
  std::vector<HtCase> v = {
      // One process per GPU.
      {0, 4096, 7168, 8, 256, Rt::uniform, 0.1, false, false, false, 1, "World_DeepSeekShape_Bf16"},
      {0, 4096, 7168, 8, 256, Rt::uniform, 0.1, true, true, true, 1, "World_DeepSeekShape_Fp8ColumnMajorScales_Int32"},
      {0, 0, 2048, 6, 64, Rt::uniform, 0.1, false, false, false, 1, "World_NoTokens"},
      {0, 1, 2048, 1, 2, Rt::uniform, 0.0, false, false, false, 1, "World_OneToken_ExpertsEqualRanks"},
      {0, 100, 2048, 8, 64, Rt::zipf, 0.1, false, false, false, 4, "World_Zipf_Aligned4"},
      {0, 100, 7168, 6, 256, Rt::one_hot, 0.1, true, false, false, 1, "World_OneHotExpert_Fp8"},
  };
  for (int R : {2, 4, 8}) {
    const std::string n = "SingleGpu" + std::to_string(R) + "_";
    v.push_back({R, 100, 2048, 8, 64, Rt::uniform, 0.1, false, false, false, 1, n + "Uniform"});
    v.push_back({R, 0, 2048, 6, 64, Rt::uniform, 0.1, false, false, false, 1, n + "NoTokens"});
    v.push_back({R, 1, 2048, 1, R, Rt::uniform, 0.0, false, true, false, 1, n + "OneToken_ExpertsEqualRanks"});
    v.push_back({R, 512, 2048, 6, 256, Rt::zipf, 0.1, true, true, true, 8, n + "Zipf_Fp8_Int32"});
    v.push_back({R, 200, 2048, 8, 8 * R, Rt::one_hot, 0.0, false, false, false, 1, n + "OneHotExpert"});
  }
  v.push_back({8, 64, 2048, 8, 8, Rt::uniform, 0.0, false, false, false, 1, "SingleGpu8_EveryTokenToEveryRank"});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, HtExchange, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<HtCase>& info) { return info.param.name; });

}  // namespace
}  // namespace epx::test
