// Drives every rank of a single-GPU team from its own host thread and stream, as separate processes
// would. An exception on a rank's thread becomes a test failure naming the rank.
//
// Rule for bodies: keep few launches in flight per rank (synchronise the stream every few steps).
// The ranks' kernels wait for each other on one GPU; if one host thread fills the GPU's command queue
// with launches that cannot run yet, the launches the others need may never be submitted.
// Nor may a body call cudaMalloc or cudaFree between the team's calls: they can wait for the whole
// GPU, so for another rank's kernel that waits for this rank's next call (seen: a wait expired in
// the second of two dispatches whose first one's inputs were freed in between).
// Nor may a body launch a kernel of its own for the first time there: CUDA loads a kernel's code at
// its first launch (lazy module loading), and loading waits for the kernels already running, the
// other ranks' waiting ones included; load it first (cudaFuncGetAttributes), as the buffers do.
// Nor may a rank copy to or from the host while another rank's kernel may wait for this rank's next
// launch: where streams share a hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1, or more streams than
// queues), a copy queued behind that waiting kernel cannot start, and while a thread is blocked in a
// synchronous copy the other threads' launches block in the driver too (seen on LL calls whose ranks
// do not wait for every rank: "combine launch took 5001 ms" on the ranks whose rows a rank waited
// for). So LL and HT bodies submit each call with submit_together (without it, the 33-rank case of
// ht_test.cu failed on 2026-11-22 on 4 x H200, in a plain run, not on one queue: many ranks' first
// dispatch waited in its count exchange for ranks whose kernel had never started): the ranks' threads
// meet before it (every copy of the previous step is done) and after it (every rank's kernel of the
// call is queued); copies and memsets (which may run on a copy engine) go before the first meeting. An
// HT exact-form dispatch returns only once its kernel has every rank's counts, which it can: every
// rank has passed the first meeting by then. One call (one kernel that waits for peers) per rank at a
// time: on a shared queue a rank's second kernel waits there for its first, and everything queued
// behind it waits too, other ranks' kernels that the first one waits for included (seen: LL dispatch
// and combine submitted together timed out on one queue). An HT call's first kernel (the layout, or
// the copy of y) waits for no peer, and the second starts beside it (programmatic dependent launch).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <barrier>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <thread>
#include <vector>

#include "epx/team.hpp"
#include "gpu_test_env.hpp"

namespace epx::test {

// The meeting point of the rank threads of the running single-GPU team (null on a world team, whose
// ranks are processes with their own hardware queues).
inline thread_local std::barrier<>* rank_threads_meeting = nullptr;

// The world team of the running body (on_ranks; null otherwise). Its ranks are processes: they meet
// before each call too (meet_world_ranks, world_meeting.cu), so that a call's ranks start together
// however long each took to check the previous call's outputs. Without it a rank that checked many
// more rows than the others (a skewed routing at T = 1024 on 4 GPUs, 2026-11-28) came to the next call
// seconds after the others, whose waits for it expired.
inline thread_local Team* world_meeting = nullptr;
void prepare_world_meeting();       // loads the meeting's kernel: before the team's first call
void meet_world_ranks(Team& team);  // returns once every rank of `team` has come

// Runs submit() (one call of this rank, or one graph launch) once every rank of the team has come
// here (a single-GPU team's threads, or a world team's processes), waits until every rank thread of a
// single-GPU team has submitted too (see the rule above; also when submit() throws), and returns what
// submit() returned.
template <typename Submit>
decltype(auto) submit_together(Submit submit) {
  struct MeetAfter {
    ~MeetAfter() {
      if (rank_threads_meeting != nullptr) rank_threads_meeting->arrive_and_wait();
    }
  };
  if (rank_threads_meeting != nullptr) rank_threads_meeting->arrive_and_wait();
  if (world_meeting != nullptr) meet_world_ranks(*world_meeting);
  const MeetAfter meet_after;
  return submit();
}

// Called by a rank thread that makes none of the team's calls from here on (and by every thread when
// its body ends, a failure included): the others' meetings no longer wait for it.
inline void leave_rank_threads_meeting() {
  if (rank_threads_meeting == nullptr) return;
  rank_threads_meeting->arrive_and_drop();
  rank_threads_meeting = nullptr;
}

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
  std::barrier<> meeting(nranks);
  std::vector<std::thread> threads;
  for (auto& team : teams) {
    threads.emplace_back([&team, &body, &meeting] {
      cudaStream_t stream = nullptr;
      rank_threads_meeting = &meeting;
      try {
        // A new thread starts on device 0: put it on the team's GPU first.
        if (cudaSetDevice(team->device()) != cudaSuccess) throw std::runtime_error("cudaSetDevice");
        if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
          throw std::runtime_error("cudaStreamCreate");
        body(*team, stream);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << team->rank() << " of " << team->size() << ": " << e.what();
      }
      leave_rank_threads_meeting();
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
  prepare_world_meeting();
  struct Meeting {
    explicit Meeting(Team& team) { world_meeting = &team; }
    ~Meeting() { world_meeting = nullptr; }
  } const meeting(world_team());
  body(world_team(), stream);
  cudaStreamDestroy(stream);
}

}  // namespace epx::test
