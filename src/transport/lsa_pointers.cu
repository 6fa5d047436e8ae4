#include <nccl_device.h>

#include "core/cuda_check.hpp"
#include "transport/lsa_pointers.hpp"

namespace epx::transport {
namespace {

// ncclGetLsaPointer only exists on the device: one thread per rank asks it once, at set-up.
__global__ void lsa_pointers_kernel(ncclWindow_t window, int nranks, void** out) {
  const int r = threadIdx.x;
  if (r < nranks) out[r] = ncclGetLsaPointer(window, 0, r);
}

}  // namespace

std::vector<void*> resolve_lsa_pointers(ncclWindow_t window, int nranks) {
  using detail::check_cuda;
  void** device_out = nullptr;
  check_cuda(cudaMalloc(&device_out, sizeof(void*) * nranks), "cudaMalloc(LSA pointers)");
  lsa_pointers_kernel<<<1, nranks>>>(window, nranks, device_out);
  const cudaError_t launched = cudaGetLastError();
  std::vector<void*> pointers(nranks);
  const cudaError_t copied =
      launched != cudaSuccess ? launched
                              : cudaMemcpy(pointers.data(), device_out, sizeof(void*) * nranks, cudaMemcpyDeviceToHost);
  cudaFree(device_out);
  check_cuda(copied, "resolving the LSA pointers of a window");
  return pointers;
}

}  // namespace epx::transport
