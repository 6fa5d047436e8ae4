// Drives every rank of a single-GPU team from its own host thread and stream, as separate processes
// would. An exception on a rank's thread becomes a test failure naming the rank.
//
// Rule for bodies: keep few launches in flight per rank (synchronise the stream every few steps).
// The ranks' kernels wait for each other on one GPU; if one host thread fills the GPU's command queue
// with launches that cannot run yet, the launches the others need may never be submitted.
// Nor may a body call cudaMalloc or cudaFree between the team's calls: they can wait for the whole
// GPU, so for another rank's kernel that waits for this rank's next call (seen: a wait expired in
// the second of two dispatches whose first one's inputs were freed in between).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <thread>
#include <vector>

#include "epx/team.hpp"
#include "gpu_test_env.hpp"

namespace epx::test {

// EPX_TEST_TIMEOUT_SCALE (a positive integer, default 1) multiplies the wait timeout of single-GPU
// teams: under compute-sanitizer the ranks' kernels, sharing one GPU, run many times slower.
inline TeamOptions scaled_for_tools(TeamOptions options) {
  const char* scale = std::getenv("EPX_TEST_TIMEOUT_SCALE");
  if (scale != nullptr && std::atoi(scale) > 1) options.wait_timeout *= std::atoi(scale);
  return options;
}

template <typename Body>
void on_single_gpu_team(int nranks, const TeamOptions& options, Body body) {
  auto teams = Team::create_single_gpu(nranks, scaled_for_tools(options));
  std::vector<std::thread> threads;
  for (auto& team : teams) {
    threads.emplace_back([&team, &body] {
      cudaStream_t stream = nullptr;
      try {
        // A new thread starts on device 0: put it on the team's GPU first.
        if (cudaSetDevice(team->device()) != cudaSuccess) throw std::runtime_error("cudaSetDevice");
        if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
          throw std::runtime_error("cudaStreamCreate");
        body(*team, stream);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << team->rank() << " of " << team->size() << ": " << e.what();
      }
      if (stream != nullptr) cudaStreamDestroy(stream);
    });
  }
  for (auto& t : threads) t.join();
}

// Runs `body(team, stream)` on every rank: of the world team (one process per GPU) when
// `single_gpu_ranks` is 0, else of a single-GPU team of that many ranks.
template <typename Body>
void on_ranks(int single_gpu_ranks, Body body) {
  if (single_gpu_ranks > 0) {
    on_single_gpu_team(single_gpu_ranks, TeamOptions{}, body);
    return;
  }
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  body(world_team(), stream);
  cudaStreamDestroy(stream);
}

}  // namespace epx::test
