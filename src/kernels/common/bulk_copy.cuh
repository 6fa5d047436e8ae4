// Hopper's bulk copy engine (TMA, non-tensor form): one thread moves a whole row between global and
// shared memory, so a few warps keep many bytes in flight without spending registers on them.
//
//   load:  global -> shared (from local memory or a peer's NVLink address), completes on an mbarrier
//          (the waiter asks for the barrier's phase parity); one mbarrier_expect_bytes per phase
//          announces the bytes of all loads of that phase.
//   store: shared -> global (local or a peer's NVLink address), tracked in bulk groups: wait_read<N>
//          until at most N committed groups still read shared memory (then it may be rewritten);
//          wait_all() until every committed store has been performed.
// Sizes and addresses are multiples of 16 bytes.
#pragma once

#include <cstdint>

#include "transport/device/flags.cuh"
#include "transport/device/wait.cuh"

namespace epx::kernels {

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_address(bar)), "r"(count) : "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the copy engine sees the initialised barrier
}

// Arrives on `bar` (initialised with count 1) announcing `bytes` of loads that will complete on it.
__device__ __forceinline__ void mbarrier_expect_bytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}

// Starts a load that completes on `bar` (announced there with mbarrier_expect_bytes).
__device__ __forceinline__ void bulk_load(void* smem_dst, const void* global_src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_address(smem_dst)),
               "l"(global_src), "r"(bytes), "r"(smem_address(bar))
               : "memory");
}

__device__ __forceinline__ bool mbarrier_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
               : "=r"(done)
               : "r"(smem_address(bar)), "r"(parity)
               : "memory");
  return done != 0;
}

// Waits for the load armed on `bar` in phase `parity`, bounded like every wait of the library.
__device__ inline bool mbarrier_wait(const transport::TeamView& team, uint64_t* bar, uint32_t parity,
                                     const transport::WaitSite& site) {
  uint64_t start = 0;
  for (uint32_t spin = 1;; ++spin) {
    if (mbarrier_try_wait(bar, parity)) return true;
    if ((spin & 1023u) == 0u) {
      const uint64_t now = transport::global_timer_ns();
      if (start == 0) start = now;
      if (now - start > team.timeout_ns) {
        transport::report_timeout(team, site, parity, 0, now - start);
        return false;
      }
    }
  }
}

__device__ __forceinline__ void bulk_store(void* global_dst, const void* smem_src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(global_dst),
               "r"(smem_address(smem_src)), "r"(bytes)
               : "memory");
}

// Orders this thread's (and, after a barrier, its CTA's) ordinary shared-memory accesses before the
// copy engine's next accesses to the same memory.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// Orders this thread's earlier generic-proxy accesses to global memory (an acquire of a flag that
// publishes rows) before its later bulk copies, and its completed bulk copies before its later accesses.
__device__ __forceinline__ void fence_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }

__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }

template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

// Every committed store performed, and ordered before this thread's later generic-proxy operations
// (the fence and done signals that publish the rows).
__device__ __forceinline__ void bulk_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  fence_async_global();
}

}  // namespace epx::kernels
