// Launching a kernel, optionally as the programmatic dependent of the kernel before it on the stream.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "core/cuda_check.hpp"

namespace epx::kernels {

// Launches `kernel` on `stream`. With `dependent`, it may start while the kernel before it on the
// stream runs (programmatic dependent launch): it must not read that kernel's outputs before
// wait_for_prior_grid (grid.cuh). Only a kernel right before it counts: anything between the two on the
// stream (an event wait, a copy) keeps the usual order.
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared_bytes, cudaStream_t stream,
            bool dependent, const char* what, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute overlap{};
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &overlap;
  config.numAttrs = dependent ? 1 : 0;
  detail::check_cuda(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...), what);
}

}  // namespace epx::kernels
