// main() of the GPU tests. Started plainly, it becomes the launcher: one process per visible GPU runs
// the same tests in the same order (so collective tests meet), and the launcher's exit status is the
// verdict. Rank 0 prints GoogleTest's usual output; the other ranks print only their failures. With
// no GPU it prints "skipped: no GPU" and exits with kSkippedExitCode, which CTest counts as skipped.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "gpu_test_env.hpp"

namespace epx::test {
namespace {

bool g_have_gpu = false;
launch::RankInfo g_rank;
std::unique_ptr<Team> g_team;

class TeardownEnvironment : public ::testing::Environment {
 public:
  void TearDown() override { g_team.reset(); }
};

// Prints each failure of a rank other than 0, prefixed with the rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: %s\n", g_rank.rank, result.file_name() ? result.file_name() : "?",
                 result.line_number(), result.message());
  }
};

}  // namespace

bool have_gpu() { return g_have_gpu; }
const launch::RankInfo& rank_info() { return g_rank; }
Team& world_team() {
  if (!g_team) g_team = launch::make_team(g_rank);
  return *g_team;
}

}  // namespace epx::test

int main(int argc, char** argv) {
  using namespace epx;
  // GoogleTest removes its flags from argv; the launcher must pass the children the original ones.
  std::vector<char*> original_argv(argv, argv + argc + 1);
  ::testing::InitGoogleTest(&argc, argv);
  if (GTEST_FLAG_GET(list_tests)) return RUN_ALL_TESTS();  // test discovery at build time: no GPU work

  // The single-GPU multi-rank tests run one stream per rank: spread them over more hardware queues than
  // the default 8. The library does not rely on it (device_check.sh runs those cases on one queue).
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  const launch::Start start = launch::start(static_cast<int>(original_argv.size()) - 1, original_argv.data());
  if (start.role == launch::Role::launcher) return start.exit_code;
  if (start.role == launch::Role::no_gpu) {
    std::printf("skipped: no GPU (epx GPU tests need an NVIDIA Hopper GPU; exit status %d means skipped)\n",
                test::kSkippedExitCode);
    return test::kSkippedExitCode;
  }
  test::g_have_gpu = true;
  test::g_rank = start.rank;
  if (cudaSetDevice(start.rank.local_rank) != cudaSuccess) {
    std::fprintf(stderr, "rank %d: cannot use CUDA device %d\n", start.rank.rank, start.rank.local_rank);
    return 1;
  }
  ::testing::AddGlobalTestEnvironment(new test::TeardownEnvironment);
  if (start.rank.rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new test::RankFailurePrinter);
  }
  return RUN_ALL_TESTS();
}
