// Kernel time as a profiler reports it: CUPTI's activity records give each kernel's start and end on the
// GPU, with no graph launch and no event around it (the way DeepEP's bench times its kernels, through
// PyTorch's profiler). The bench loads CUPTI when it runs (dlopen), so a machine without it still runs
// every other measurement; EPX_CUPTI_LIBRARY names the library where the default names do not find it.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/timing.hpp"
#include "epx/team.hpp"

namespace epx::bench {

class KernelClock {
 public:
  // CUPTI loaded and ready, or nullptr with `why_not` saying what is missing. It opens once per process
  // (CUPTI takes one set of buffer callbacks).
  static std::unique_ptr<KernelClock> open(std::string& why_not);
  ~KernelClock();
  KernelClock(const KernelClock&) = delete;
  KernelClock& operator=(const KernelClock&) = delete;

  // Records the kernels that `run()` launches, then synchronises `stream` (where run() enqueues its work)
  // and returns, for each graph launch among them in launch order, the span from its first kernel's start
  // to its last kernel's end, in us. Kernels launched outside a graph (a barrier) are left out.
  std::vector<double> graph_launch_spans(cudaStream_t stream, const std::function<void()>& run);

  struct Library;

 private:
  explicit KernelClock(std::unique_ptr<Library> library);
  std::unique_ptr<Library> library_;
};

// Collective: CUPTI opened on every rank, or nullptr on every rank with `why_not` (the kernel passes replay
// graphs after team barriers, so every rank runs them or none).
std::unique_ptr<KernelClock> open_kernel_clock(Team& team, std::string& why_not);

// The kernel time (KernelClock::graph_launch_spans) of the last `replays` of the `warmup` + `replays`
// graph launches that run() makes; all zero where `clock` is null or CUPTI reported another number of
// launches. Graphs made before recording began might not be traced: run() captures its own.
Timing graph_kernel_time(KernelClock* clock, cudaStream_t stream, int warmup, int replays,
                         const std::function<void()>& run);

}  // namespace epx::bench
