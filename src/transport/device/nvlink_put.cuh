// Remote put-with-signal over NVLink: data goes out as plain 16-byte stores to the peer's address
// (from SymmetricView), then one thread adds to the peer's signal counter with a system-scope
// release. The receiver waits on the counter (wait_at_least) and may then read the data.
//
// A later transport (GIN for RDMA) provides the same three functions, so kernels written against
// this interface only change their template argument.
#pragma once

#include <cstddef>
#include <cstdint>

#include "transport/device/flags.cuh"

namespace epx::transport {

struct NvlinkPut {
  // Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) with threads tid, tid+nthreads, ...
  __device__ static void copy(void* dst, const void* src, std::size_t bytes, int tid, int nthreads) {
    const int4* s = static_cast<const int4*>(src);
    int4* d = static_cast<int4*>(dst);
    const std::size_t n = bytes / sizeof(int4);
    for (std::size_t i = tid; i < n; i += nthreads) d[i] = s[i];
  }

  // The whole CTA copies, then thread 0 signals. Every thread of the CTA must call it.
  __device__ static void put_signal_block(void* dst, const void* src, std::size_t bytes, uint64_t* remote_signal,
                                          uint64_t add) {
    copy(dst, src, bytes, threadIdx.x, blockDim.x);
    __syncthreads();  // orders every thread's stores before thread 0's release
    if (threadIdx.x == 0) add_release_sys(remote_signal, add);
  }
};

}  // namespace epx::transport
