#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "launcher/launcher.hpp"

namespace epx::launch {
namespace {

// Sets the torchrun variables for one test and removes them after.
class TorchrunEnvironment : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "NCCL_COMM_ID"}) {
      unsetenv(name);
    }
  }
  static void set_all(const char* rank, const char* world, const char* local, const char* port) {
    setenv("RANK", rank, 1);
    setenv("WORLD_SIZE", world, 1);
    setenv("LOCAL_RANK", local, 1);
    setenv("MASTER_ADDR", "10.1.2.3", 1);
    setenv("MASTER_PORT", port, 1);
  }
};

TEST_F(TorchrunEnvironment, AbsentMeansNotTorchrun) {
  RankInfo info;
  EXPECT_FALSE(read_torchrun_environment(info));
}

TEST_F(TorchrunEnvironment, ReadsRankAndDerivesTheNcclAddress) {
  set_all("5", "8", "1", "29500");
  RankInfo info;
  ASSERT_TRUE(read_torchrun_environment(info));
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 1);
  ASSERT_NE(std::getenv("NCCL_COMM_ID"), nullptr);
  EXPECT_STREQ(std::getenv("NCCL_COMM_ID"), "10.1.2.3:29501");  // MASTER_PORT is torchrun's own store
}

TEST_F(TorchrunEnvironment, KeepsAnExplicitNcclCommId) {
  set_all("0", "2", "0", "29500");
  setenv("NCCL_COMM_ID", "10.9.9.9:4000", 1);
  RankInfo info;
  ASSERT_TRUE(read_torchrun_environment(info));
  EXPECT_STREQ(std::getenv("NCCL_COMM_ID"), "10.9.9.9:4000");
}

TEST_F(TorchrunEnvironment, RejectsARankBeyondTheWorld) {
  set_all("4", "4", "0", "29500");
  RankInfo info;
  EXPECT_THROW(read_torchrun_environment(info), Error);
}

TEST_F(TorchrunEnvironment, RejectsAMissingVariable) {
  set_all("0", "2", "0", "29500");
  unsetenv("MASTER_ADDR");
  RankInfo info;
  try {
    read_torchrun_environment(info);
    FAIL() << "a missing MASTER_ADDR was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MASTER_ADDR"), std::string::npos) << e.what();
  }
}

TEST_F(TorchrunEnvironment, RejectsGarbage) {
  set_all("one", "2", "0", "29500");
  RankInfo info;
  EXPECT_THROW(read_torchrun_environment(info), Error);
}

// The launcher's process handling, with /bin/sh standing in for a rank.
const std::string kShell = "/bin/sh";
int run_shell(const std::string& script, int ranks, std::chrono::seconds grace = std::chrono::seconds(30)) {
  return run_ranks(kShell, {kShell, "-c", script}, ranks, "ab", grace);
}

TEST(RunRanks, AllSucceed) { EXPECT_EQ(run_shell("exit 0", 3), 0); }

TEST(RunRanks, EveryRankSeesItsRankTheWorldAndTheId) {
  EXPECT_EQ(run_shell("[ \"$EPX_LAUNCH_WORLD_SIZE\" = 4 ] && [ \"$EPX_LAUNCH_UNIQUE_ID\" = ab ] && "
                      "[ \"$EPX_LAUNCH_RANK\" -ge 0 ] && [ \"$EPX_LAUNCH_RANK\" -lt 4 ]",
                      4),
            0);
}

TEST(RunRanks, AFailureIsReportedAndTheOthersAreKilledAfterTheGrace) {
  const auto start = std::chrono::steady_clock::now();
  // Rank 1 fails at once; rank 0 would sleep for a minute.
  EXPECT_EQ(run_shell("if [ \"$EPX_LAUNCH_RANK\" = 1 ]; then exit 3; fi; exec sleep 60", 2, std::chrono::seconds(1)),
            3);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

TEST(RunRanks, ASignalCountsAsAFailure) { EXPECT_EQ(run_shell("kill -9 $$", 1), 128 + 9); }

TEST(UniqueIdHex, RoundTrips) {
  UniqueId id;
  for (std::size_t i = 0; i < id.bytes.size(); ++i) id.bytes[i] = static_cast<char>(i * 37 + 11);
  const std::string hex = encode_unique_id(id);
  EXPECT_EQ(hex.size(), 256u);
  EXPECT_EQ(hex.substr(0, 4), "0b30");
  EXPECT_EQ(decode_unique_id(hex).bytes, id.bytes);
}

TEST(UniqueIdHex, RejectsBadText) {
  EXPECT_THROW(decode_unique_id("abc"), Error);
  EXPECT_THROW(decode_unique_id(std::string(256, 'g')), Error);
}

}  // namespace
}  // namespace epx::launch
