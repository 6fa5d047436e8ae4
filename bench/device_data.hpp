// Device memory and streams for the bench: owning handles, and copies between host and device that
// return once the data has arrived.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/cuda_check.hpp"
#include "epx/tensor.hpp"

namespace epx::bench {

// The number of SMs of CUDA device `device`.
inline int device_sm_count(int device) {
  int sms = 0;
  detail::check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  return sms;
}

struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};
using DeviceMemory = std::unique_ptr<void, CudaFree>;

inline DeviceMemory device_alloc(std::size_t bytes) {
  void* p = nullptr;
  detail::check_cuda(cudaMalloc(&p, std::max<std::size_t>(bytes, 16)), "cudaMalloc");
  return DeviceMemory(p);
}

template <class T>
DeviceMemory upload(const std::vector<T>& host, cudaStream_t stream) {
  DeviceMemory d = device_alloc(host.size() * sizeof(T));
  detail::check_cuda(cudaMemcpyAsync(d.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, stream),
                     "cudaMemcpyAsync");
  detail::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");  // `host` may go away next
  return d;
}

// Copies n elements from `device` into `host` (which has room) once the stream's work is done.
template <class T>
void download_into(T* host, const void* device, std::size_t n, cudaStream_t stream) {
  if (n != 0) {
    detail::check_cuda(cudaMemcpyAsync(host, device, n * sizeof(T), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  }
  detail::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

template <class T>
std::vector<T> download(const void* device, std::size_t n, cudaStream_t stream) {
  std::vector<T> host(n);
  download_into(host.data(), device, n, stream);
  return host;
}

// A row-major copy of a (possibly row-strided) tensor.
template <class T>
std::vector<T> download(const TensorRef& t, cudaStream_t stream) {
  if (element_size(t.type) != int(sizeof(T)) || (t.cols > 1 && t.col_stride != 1)) {
    throw std::logic_error("bench: cannot download a " + std::string(to_string(t.type)) + " tensor this way");
  }
  std::vector<T> host(std::size_t(t.rows * t.cols));
  if (!host.empty()) {
    detail::check_cuda(cudaMemcpy2DAsync(host.data(), t.cols * sizeof(T), t.data, t.row_stride * sizeof(T),
                                         t.cols * sizeof(T), t.rows, cudaMemcpyDeviceToHost, stream),
                       "cudaMemcpy2DAsync");
  }
  detail::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return host;
}

struct StreamDestroy {
  void operator()(cudaStream_t s) const { cudaStreamDestroy(s); }
};
using Stream = std::unique_ptr<CUstream_st, StreamDestroy>;

inline Stream new_stream() {
  cudaStream_t s = nullptr;
  detail::check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  return Stream(s);
}

}  // namespace epx::bench
