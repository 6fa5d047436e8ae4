// A peer process killed mid-run. Every rank makes an NCCL team and two LL buffers, one with
// mask_on_timeout, and exchanges once on each; then the last rank kills itself (SIGKILL). Each survivor
// must, within the team's wait timeout plus host time:
//   * on the mask_on_timeout buffer: finish its next exchange without the dead rank (checked against
//     the reference of the exchange that masks it) and show it in the rank mask;
//   * on the other buffer: get an epx::Error of kind timeout naming the dead rank;
//   * then destroy both buffers and the team without waiting for the dead rank, and exit.
//
// The program is its own launcher: started plainly, it starts one rank per visible GPU (at least two)
// and its verdict is "the last rank died of SIGKILL and every survivor passed". Survivors report
// through files in a directory the launcher makes, since the launcher's combined exit status is the
// first failure's (the killed rank's).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "epx/ll.hpp"
#include "expect_error.hpp"
#include "gpu_test_env.hpp"
#include "launcher/launcher.hpp"
#include "ll_fixture.hpp"

namespace epx::test {
namespace {

constexpr char kReportDirVariable[] = "EPX_DEAD_PEER_REPORTS";
constexpr std::chrono::milliseconds kTimeout{2000};
// Host work on top of the timeout (reference checks, copies, teardown): generous, never near a hang.
constexpr std::chrono::seconds kHostSlack{10};
constexpr uint32_t kSeed = 7300;

launch::RankInfo g_rank;

using Clock = std::chrono::steady_clock;

TEST(DeadPeer, SurvivorsReportItAndShutDown) {
  const int R = g_rank.world_size, rank = g_rank.rank, dead = R - 1;
  const LlCase c = ll_small_case(0);
  std::unique_ptr<Team> team = launch::make_team(g_rank, TeamOptions{kTimeout});
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const LlExpected everyone = build_ll_expected(c, R, kSeed);
  LlBufferOptions options = ll_buffer_options(c, everyone);
  auto strict = std::make_unique<LlBuffer>(*team, options);
  options.mask_on_timeout = true;
  auto masking = std::make_unique<LlBuffer>(*team, options);
  const LlRankInputs in = upload_ll_inputs(c, everyone, rank);
  const LlOutputs out = allocate_ll_outputs(c, everyone, *strict);
  ll_exchange_and_check(c, everyone, *strict, *team, in, out, stream);
  ll_exchange_and_check(c, everyone, *masking, *team, in, out, stream);
  if (rank == dead) {
    std::fflush(nullptr);
    std::raise(SIGKILL);
  }

  std::vector<bool> masked(std::size_t(R), false);
  masked[std::size_t(dead)] = true;
  const LlExpected survivors = ll_masked_expected(c, R, kSeed + 1, masked);
  write_ll_inputs(c, survivors, rank, in);
  Clock::time_point start = Clock::now();
  ll_exchange_and_check(c, survivors, *masking, *team, in, out, stream);
  masking->check_errors();  // a masked peer is not an error
  EXPECT_LT(Clock::now() - start, kTimeout + kHostSlack) << "the masking exchange took too long";
  DeviceArray mask(sizeof(int32_t) * R);
  masking->query_rank_mask(static_cast<int32_t*>(mask.data), stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<int32_t> got(static_cast<std::size_t>(R));
  copy_from_device(got, mask.data);
  EXPECT_EQ(got, std::vector<int32_t>(masked.begin(), masked.end()));

  start = Clock::now();
  expect_error(ErrorKind::timeout, {"waiting for rank " + std::to_string(dead)}, [&] {
    strict->dispatch(ll_dispatch_args(c, in, out), Streams{stream});
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    strict->check_errors();
  });
  EXPECT_LT(Clock::now() - start, kTimeout + kHostSlack) << "the timeout was reported too late";
  EXPECT_TRUE(team->failed());

  start = Clock::now();
  masking.reset();
  strict.reset();
  team.reset();
  EXPECT_LT(Clock::now() - start, kHostSlack) << "tearing down after a dead peer took too long";
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// The launcher: every survivor must have written "passed", and the last rank must have been killed.
int launch_and_judge(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2) {
    std::printf("skipped: the dead-peer test needs 2 GPUs (exit status %d means skipped)\n", kSkippedExitCode);
    return kSkippedExitCode;
  }
  char pattern[] = "/tmp/epx-dead-peer-XXXXXX";
  const char* dir = mkdtemp(pattern);
  if (dir == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  setenv(kReportDirVariable, dir, 1);
  const launch::Start start = launch::start(argc, argv, launch::Options{std::chrono::seconds(120)});
  bool passed = start.exit_code == 128 + SIGKILL;
  if (!passed) std::printf("the ranks' combined exit status is %d, want %d (killed)\n", start.exit_code, 128 + SIGKILL);
  for (int r = 0; r + 1 < devices; ++r) {
    std::ifstream in(std::filesystem::path(dir) / ("rank" + std::to_string(r)));
    std::string verdict;
    in >> verdict;
    if (verdict != "passed") std::printf("survivor rank %d: %s\n", r, verdict.empty() ? "no report" : verdict.c_str());
    passed = passed && verdict == "passed";
  }
  std::filesystem::remove_all(dir);
  std::printf("dead-peer test: %s\n", passed ? "PASSED" : "FAILED");
  return passed ? 0 : 1;
}

}  // namespace

bool have_gpu() { return true; }
const launch::RankInfo& rank_info() { return g_rank; }

}  // namespace epx::test

int main(int argc, char** argv) {
  using namespace epx::test;
  std::vector<char*> original_argv(argv, argv + argc + 1);  // GoogleTest removes its flags from argv
  ::testing::InitGoogleTest(&argc, argv);
  if (GTEST_FLAG_GET(list_tests)) return RUN_ALL_TESTS();
  const char* reports = std::getenv(kReportDirVariable);
  if (reports == nullptr) return launch_and_judge(static_cast<int>(original_argv.size()) - 1, original_argv.data());
  const epx::launch::Start start = epx::launch::start(static_cast<int>(original_argv.size()) - 1, original_argv.data());
  if (start.role != epx::launch::Role::rank) return 1;  // a child always is a rank
  g_rank = start.rank;
  if (cudaSetDevice(g_rank.local_rank) != cudaSuccess) return 1;
  const int failed = RUN_ALL_TESTS();
  std::ofstream(std::filesystem::path(reports) / ("rank" + std::to_string(g_rank.rank)))
      << (failed ? "failed" : "passed");
  return failed;
}
