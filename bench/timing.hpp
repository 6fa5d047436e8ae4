// Event timing for the bench: every repetition is timed on its own and the median is reported.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <vector>

#include "core/cuda_check.hpp"

namespace epx::bench {

struct Timing {
  double median_us = 0;
  double min_us = 0;
  double max_us = 0;
};

inline Timing summarize(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  return Timing{us[us.size() / 2], us.front(), us.back()};
}

// Times `timed(stream)` `repetitions` times after `warmup` untimed runs; `before(stream)` runs untimed
// ahead of every repetition (a barrier, an L2 flush, a rotation of inputs).
inline Timing time_on_stream(cudaStream_t stream, int warmup, int repetitions,
                             const std::function<void(cudaStream_t)>& before,
                             const std::function<void(cudaStream_t)>& timed) {
  using detail::check_cuda;
  for (int i = 0; i < warmup; ++i) {
    before(stream);
    timed(stream);
  }
  std::vector<cudaEvent_t> events(2 * repetitions);
  for (auto& e : events) check_cuda(cudaEventCreate(&e), "cudaEventCreate");
  for (int i = 0; i < repetitions; ++i) {
    before(stream);
    check_cuda(cudaEventRecord(events[2 * i], stream), "cudaEventRecord");
    timed(stream);
    check_cuda(cudaEventRecord(events[2 * i + 1], stream), "cudaEventRecord");
  }
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  std::vector<double> us(repetitions);
  for (int i = 0; i < repetitions; ++i) {
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, events[2 * i], events[2 * i + 1]), "cudaEventElapsedTime");
    us[i] = ms * 1000.0;
  }
  for (auto& e : events) cudaEventDestroy(e);
  return summarize(std::move(us));
}

struct GraphExecDestroy {
  void operator()(cudaGraphExec_t g) const { cudaGraphExecDestroy(g); }
};
using GraphExec = std::unique_ptr<CUgraphExec_st, GraphExecDestroy>;

// One replay of `graph` on `stream`.
inline void launch_graph(const GraphExec& graph, cudaStream_t stream) {
  detail::check_cuda(cudaGraphLaunch(graph.get(), stream), "cudaGraphLaunch");
}

// `calls(stream)` captured on `stream` into an instantiated graph (nothing left behind if it throws).
inline GraphExec capture_graph(cudaStream_t stream, const std::function<void(cudaStream_t)>& calls) {
  using detail::check_cuda;
  cudaGraph_t graph = nullptr;
  check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  try {
    calls(stream);
  } catch (...) {
    if (cudaStreamEndCapture(stream, &graph) == cudaSuccess && graph != nullptr) cudaGraphDestroy(graph);
    throw;
  }
  check_cuda(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  check_cuda(status, "cudaGraphInstantiate");
  return GraphExec(exec);
}

// `calls(stream)` captured alone in a graph (capture_graph), then timed one launch at a time
// (time_on_stream), each after before(stream).
inline Timing time_graph(cudaStream_t stream, int warmup, int repetitions,
                         const std::function<void(cudaStream_t)>& calls,
                         const std::function<void(cudaStream_t)>& before) {
  const GraphExec exec = capture_graph(stream, calls);
  return time_on_stream(stream, warmup, repetitions, before, [&](cudaStream_t s) { launch_graph(exec, s); });
}

// `calls_per_graph` calls of call(stream) captured in one graph, timed as time_graph times it; per call, a
// replay's time divided by calls_per_graph (the median replay's, the fastest's and the slowest's).
inline Timing time_graph_per_call(cudaStream_t stream, int warmup, int repetitions, int calls_per_graph,
                                  const std::function<void(cudaStream_t)>& call,
                                  const std::function<void(cudaStream_t)>& before) {
  const Timing replay = time_graph(
      stream, warmup, repetitions,
      [&](cudaStream_t s) {
        for (int i = 0; i < calls_per_graph; ++i) call(s);
      },
      before);
  return Timing{replay.median_us / calls_per_graph, replay.min_us / calls_per_graph, replay.max_us / calls_per_graph};
}

// `rounds` rounds, each after before(stream): events around `replays` calls of launch(stream, i), i = 0 ..
// replays - 1, back to back (each launch overlapping the work before it, as in a stream of calls); per
// launch, the round's time divided by `replays` (the median round's, the fastest's and the slowest's).
inline Timing time_in_a_row(cudaStream_t stream, int rounds, int replays,
                            const std::function<void(cudaStream_t)>& before,
                            const std::function<void(cudaStream_t, int)>& launch) {
  const Timing round = time_on_stream(stream, 0, rounds, before, [&](cudaStream_t s) {
    for (int i = 0; i < replays; ++i) launch(s, i);
  });
  return Timing{round.median_us / replays, round.min_us / replays, round.max_us / replays};
}

}  // namespace epx::bench
