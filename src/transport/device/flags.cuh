// Memory-ordered accesses to flags shared between GPUs: 64-bit counters that only grow (a waiter asks
// "has it reached at least N?" and never misses a value), or stamped words (core::stamped: a call's stamp
// beside a value, read and written whole).
//
// Ordering rule of the library: whoever publishes data to a peer first makes the data visible
// (a barrier among its writing threads, then a system-scope release by the one thread that
// signals); whoever consumes it reads the flag with a system-scope acquire before touching the data.
// A signal that publishes nothing, as LL's "freed" (what it vouches for ended with an earlier kernel),
// is a relaxed store (kernels/ll/protocol.cuh).
#pragma once

#include <cstdint>

namespace epx::transport {

__device__ __forceinline__ uint64_t load_acquire_sys(const uint64_t* flag) {
  uint64_t value;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(value) : "l"(flag) : "memory");
  return value;
}

__device__ __forceinline__ uint64_t load_relaxed_sys(const uint64_t* flag) {
  uint64_t value;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(value) : "l"(flag) : "memory");
  return value;
}

__device__ __forceinline__ uint32_t load_relaxed_sys(const uint32_t* word) {
  uint32_t value;
  asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(value) : "l"(word) : "memory");
  return value;
}

// Adds to a (possibly remote) counter; everything this thread may observe before, including other
// threads' writes ordered before it by a barrier, is visible to whoever acquires the new value.
__device__ __forceinline__ void add_release_sys(uint64_t* flag, uint64_t value) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(flag), "l"(value) : "memory");
}

// A GPU-scope counter of this GPU's CTAs: returns the value before; orders this thread's earlier
// accesses before the add and its later ones after it (the hardware fences first: MEMBAR, ERRBAR).
__device__ __forceinline__ uint32_t add_acq_rel_gpu(uint32_t* counter, uint32_t value) {
  uint32_t before;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(before) : "l"(counter), "r"(value) : "memory");
  return before;
}

// A GPU-scope count with no ordering at all (returns the value before): for a count that orders nothing
// the counting thread accessed before it (LL's FreedRecord: what its last counter writes, only later
// kernels read), so that the thread need not wait for its earlier accesses first, as a release (MEMBAR,
// ERRBAR) would make it.
__device__ __forceinline__ uint32_t add_relaxed_gpu(uint32_t* counter, uint32_t value) {
  uint32_t before;
  asm volatile("atom.relaxed.gpu.global.add.u32 %0, [%1], %2;" : "=r"(before) : "l"(counter), "r"(value) : "memory");
  return before;
}

// For a word that carries its own data (core::stamped), or a signal that orders nothing (LL's "freed", see
// kernels/ll/protocol.cuh): no ordering, only that its 8 bytes land whole.
__device__ __forceinline__ void store_relaxed_sys(uint64_t* word, uint64_t value) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(word), "l"(value) : "memory");
}

// For a flag that only the CTAs of one GPU read (a kernel's private words): a GPU-scope release is
// cheaper than a system-scope one.
__device__ __forceinline__ void store_release_gpu(uint64_t* flag, uint64_t value) {
  asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(flag), "l"(value) : "memory");
}

__device__ __forceinline__ void store_release_sys(uint64_t* flag, uint64_t value) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(flag), "l"(value) : "memory");
}

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

}  // namespace epx::transport
