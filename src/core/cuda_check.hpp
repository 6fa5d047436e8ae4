// Checking CUDA runtime calls: every call the library makes goes through check_cuda, so that a failure
// becomes an epx::Error naming the rank, the call site and what was being done.
#pragma once

#include <cuda_runtime_api.h>

#include <mutex>
#include <set>
#include <source_location>
#include <string>
#include <utility>

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

// Lets `kernel` use `bytes` of dynamic shared memory on the current device: set once per process and
// device, when the first buffer is made. Setting a kernel's attribute again while launches of it are
// queued may wait for them, and on a single-GPU team those may be another rank's launches, queued
// behind a kernel that waits for this rank.
inline void allow_dynamic_shared_memory(const void* kernel, int bytes, const char* name,
                                        std::source_location where = std::source_location::current()) {
  static std::mutex mutex;
  static std::set<std::pair<const void*, int>> done;  // (kernel, device)
  int device = -1;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice", where);
  const std::lock_guard lock(mutex);
  if (done.count({kernel, device}) != 0) return;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), name, where);
  done.insert({kernel, device});
}

}  // namespace epx::detail
