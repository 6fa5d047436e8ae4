#include "bench/hold_stream.hpp"

#include "core/cuda_check.hpp"
#include "transport/device/flags.cuh"

namespace epx::bench {
namespace {

__global__ void hold_kernel(uint64_t ns) {
  const uint64_t until = transport::global_timer_ns() + ns;
  while (transport::global_timer_ns() < until) __nanosleep(1000);
}

}  // namespace

void load_hold_kernel() { detail::load_kernel(reinterpret_cast<const void*>(hold_kernel), "hold_kernel"); }

void hold_stream(cudaStream_t stream, uint64_t ns) {
  hold_kernel<<<1, 1, 0, stream>>>(ns);
  detail::check_launch("hold_kernel");
}

}  // namespace epx::bench
