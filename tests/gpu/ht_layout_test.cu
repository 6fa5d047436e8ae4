// HtBuffer::get_layout against the CPU reference: token counts per rank and per expert, and
// is_token_in_rank, for token counts that fill zero, one and several of the layout kernel's tiles, top-k
// up to the buffer's limit of 32, int64 and int32 ids, empty slots and tokens naming an expert twice.
// Each rank calls it three times on the same stream with its outputs poisoned before each call: the
// kernel's tiles hand their counts to each other through words that every call reuses. The layout waits
// for no peer, but each call still goes to the GPU together with the other ranks' (submit_together,
// single_gpu_ranks.hpp), as every call of the HT tests' single-GPU teams does.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "epx/ht.hpp"
#include "epx/reference/layout.hpp"
#include "ht_fixture.hpp"
#include "routing_fixture.hpp"
#include "single_gpu_ranks.hpp"

namespace epx::test {
namespace {

struct LayoutCase {
  int R, T, K, E;
  bool int32;
  bool repeats;  // some tokens name one expert in two slots
  std::string name;
};

// Routing of one rank: random experts, 10% empty slots, and with `repeats` every seventh token's last
// slot a copy of its first.
ref::Matrix<int64_t> routing_of(const LayoutCase& c, int rank) {
  std::mt19937 rng = rank_rng(uint32_t(std::hash<std::string>{}(c.name)), rank, 0);
  ref::Matrix<int64_t> idx = make_topk_idx(rng, c.T, c.K, c.E, Routing::uniform, 0.1);
  if (c.repeats && c.K > 1) {
    for (int t = 0; t < c.T; t += 7) idx.at(t, c.K - 1) = idx.at(t, 0);
  }
  return idx;
}

void run_rank(const LayoutCase& c, Team& team, cudaStream_t stream) {
  const ref::Matrix<int64_t> idx64 = routing_of(c, team.rank());
  const ref::ExpertPlacement placement(c.E, c.R);
  const ref::Layout want = ref::compute_layout(idx64, placement);

  DeviceArray d_idx(idx64.data.size() * (c.int32 ? sizeof(int32_t) : sizeof(int64_t)));
  copy_topk_to_device(d_idx.data, idx64, c.int32);
  const TensorRef topk = TensorRef::matrix(d_idx.data, c.int32 ? ScalarType::int32 : ScalarType::int64, c.T, c.K);
  DeviceArray per_rank(sizeof(int32_t) * c.R), per_expert(sizeof(int32_t) * c.E), in_rank(std::size_t(c.T) * c.R);

  // The buffer holds more tokens than the call: the grid follows the call's tokens, not the buffer's.
  HtBuffer buffer(team, HtBufferOptions{c.T + 3000, 2048, 32, c.E});
  for (int call = 0; call < 3; ++call) {
    poison(TensorRef::vector(per_rank.data, ScalarType::int32, c.R), stream);
    poison(TensorRef::vector(per_expert.data, ScalarType::int32, c.E), stream);
    poison(TensorRef::matrix(in_rank.data, ScalarType::boolean, c.T, c.R), stream);
    const HtLayout out{static_cast<int32_t*>(per_rank.data), static_cast<int32_t*>(per_expert.data),
                       static_cast<bool*>(in_rank.data)};
    submit_together([&] { buffer.get_layout(topk, out, HtStreams{stream}); });
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);

    std::vector<int32_t> got_rank(c.R), got_expert(c.E);
    std::vector<uint8_t> got_in_rank(std::size_t(c.T) * c.R);
    copy_from_device(got_rank, per_rank.data);
    copy_from_device(got_expert, per_expert.data);
    copy_from_device(got_in_rank, in_rank.data);
    EXPECT_EQ(got_rank, want.num_tokens_per_rank) << "rank " << team.rank() << ", call " << call;
    EXPECT_EQ(got_expert, want.num_tokens_per_expert) << "rank " << team.rank() << ", call " << call;
    EXPECT_EQ(got_in_rank, want.is_token_in_rank.data) << "rank " << team.rank() << ", call " << call;
  }
  buffer.check_errors();
}

class HtLayoutTest : public ::testing::TestWithParam<LayoutCase> {};

TEST_P(HtLayoutTest, MatchesReference) {
  const LayoutCase& c = GetParam();
  on_single_gpu_team(c.R, TeamOptions{}, [&](Team& team, cudaStream_t stream) { run_rank(c, team, stream); });
}

std::vector<LayoutCase> cases() {
  return {
      {2, 0, 8, 64, false, false, "NoTokens"},
      {2, 1, 1, 2, true, false, "OneToken_TopOne"},
      {2, 256, 8, 256, false, true, "OneFullTile"},
      {2, 257, 8, 256, true, false, "OneTokenIntoTheSecondTile"},
      {2, 5000, 8, 256, false, true, "TwentyTiles_DeepSeekRouting"},
      {4, 3000, 9, 64, true, true, "NineSlots_Int32"},
      {8, 2100, 32, 256, false, true, "ThirtyTwoSlots_EightRanks"},
  };
}

INSTANTIATE_TEST_SUITE_P(Cases, HtLayoutTest, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<LayoutCase>& info) { return info.param.name; });

}  // namespace
}  // namespace epx::test
