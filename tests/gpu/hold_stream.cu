#include "hold_stream.hpp"

#include "core/cuda_check.hpp"

namespace epx::test {
namespace {

__global__ void hold_kernel(uint64_t ns) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

}  // namespace

void load_hold_kernel() { detail::load_kernel(reinterpret_cast<const void*>(hold_kernel), "hold_kernel"); }

void hold_stream(cudaStream_t stream, uint64_t ns) {
  hold_kernel<<<1, 1, 0, stream>>>(ns);
  detail::check_launch("hold_kernel");
}

}  // namespace epx::test
