// What every GPU test may ask of its process: whether a GPU is there, which rank of the multi-process
// job it is, and that job's NCCL team (made on first use, shared by the tests of this process).
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "epx/team.hpp"
#include "launcher/launcher.hpp"

namespace epx::test {

// Exit status of the GPU test binary on a machine without a GPU (CTest's SKIP_RETURN_CODE).
inline constexpr int kSkippedExitCode = 77;

bool have_gpu();
const launch::RankInfo& rank_info();
Team& world_team();

}  // namespace epx::test

// Skips the calling test unless the job has at least `n` processes (GPUs).
#define EPX_REQUIRE_WORLD_SIZE(n)                                                                           \
  do {                                                                                                      \
    if (::epx::test::rank_info().world_size < (n))                                                          \
      GTEST_SKIP() << "needs " << (n) << " GPUs, this machine has " << ::epx::test::rank_info().world_size; \
  } while (0)
