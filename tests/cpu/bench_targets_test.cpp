// The bench's targets: the issues' numbers, at their team sizes and default shapes only.
#include <gtest/gtest.h>

#include "bench/targets.hpp"

namespace epx::bench {
namespace {

TEST(BenchTargets, HtTargetsAtTheirTeamSizesOnly) {
  EXPECT_EQ(ht_target(2, true, "layout", "int64").max_us, 15);
  EXPECT_EQ(ht_target(2, true, "dispatch", "bf16").max_us, 190);
  EXPECT_EQ(ht_target(2, true, "dispatch", "fp8").max_us, 105);
  EXPECT_EQ(ht_target(2, true, "combine", "bf16").max_us, 190);
  EXPECT_EQ(ht_target(2, true, "combine_zero_copy", "bf16").max_us, 190);
  EXPECT_FALSE(ht_target(2, true, "dispatch_cached", "bf16").any());
  EXPECT_FALSE(ht_target(4, true, "dispatch", "bf16").any());
  EXPECT_EQ(ht_target(8, true, "dispatch", "bf16").min_algo_gbps, 340);
  EXPECT_EQ(ht_target(8, true, "dispatch", "bf16").max_us, 0);
  EXPECT_FALSE(ht_target(8, true, "dispatch", "fp8").any());
  EXPECT_FALSE(ht_target(2, false, "dispatch", "bf16").any());
}

TEST(BenchTargets, LlTargetsAtTheirTeamSizesOnly) {
  EXPECT_EQ(ll_target(2, true, "dispatch", "fp8", "").max_us, 10);
  EXPECT_EQ(ll_target(2, true, "combine", "bf16", "local").max_us, 12);
  EXPECT_EQ(ll_target(8, true, "dispatch", "fp8", "").max_us, 25);
  EXPECT_EQ(ll_target(8, true, "combine", "bf16", "local").max_us, 30);
  EXPECT_FALSE(ll_target(2, true, "dispatch", "bf16", "").any());
  EXPECT_FALSE(ll_target(2, true, "combine", "bf16", "naive").any());
  EXPECT_FALSE(ll_target(4, true, "dispatch", "fp8", "").any());
  EXPECT_FALSE(ll_target(8, false, "dispatch", "fp8", "").any());
  EXPECT_EQ(kLlBufferTargetBytes, std::size_t(64) * 1000 * 1000);
}

TEST(BenchTargets, MetAndText) {
  const Target time{190, 0}, bandwidth{0, 340};
  EXPECT_TRUE(time.met(190, 0));
  EXPECT_FALSE(time.met(190.1, 1000));
  EXPECT_FALSE(time.met(0, 0));  // a time not measured meets nothing
  EXPECT_TRUE(bandwidth.met(0, 340));
  EXPECT_TRUE(bandwidth.met(1e6, 340));
  EXPECT_FALSE(bandwidth.met(1, 339.9));
  EXPECT_EQ(time.text(), "<= 190 us");
  EXPECT_EQ(bandwidth.text(), ">= 340 GB/s");
  EXPECT_EQ(Target{}.text(), "-");
  EXPECT_FALSE(Target{}.any());
}

}  // namespace
}  // namespace epx::bench
