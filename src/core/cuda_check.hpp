// Checking CUDA runtime calls: every call the library makes goes through check_cuda, so that a failure
// becomes an epx::Error naming the rank, the call site and what was being done.
#pragma once

#include <cuda_runtime_api.h>

#include <source_location>
#include <string>

#include "core/rank_context.hpp"

namespace epx::detail {

inline void check_cuda(cudaError_t status, const char* what,
                       std::source_location where = std::source_location::current()) {
  if (status == cudaSuccess) return;
  fail(ErrorKind::cuda, std::string(what) + " failed: " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) +
                            ") at " + where.file_name() + ":" + std::to_string(where.line()));
}

// After a kernel launch: catches bad launch configurations at the call site.
inline void check_launch(const char* kernel, std::source_location where = std::source_location::current()) {
  check_cuda(cudaGetLastError(), kernel, where);
}

// Loads a kernel's code into the current context now. With CUDA's lazy module loading (the default),
// the first launch of a kernel loads it, and loading waits for the kernels already running on the
// device. On a single-GPU team those may be other ranks' kernels waiting for this rank's next launch:
// a deadlock. Buffers load their kernels when they are made, before any collective work.
inline void load_kernel(const void* kernel, const char* name,
                        std::source_location where = std::source_location::current()) {
  cudaFuncAttributes attributes{};
  check_cuda(cudaFuncGetAttributes(&attributes, kernel), name, where);
}

}  // namespace epx::detail
