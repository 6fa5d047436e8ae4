// A kernel that keeps a stream busy for a while: a rank that comes late to a call, a call made while its
// stream is still busy (the GPU tests), or calls queued on the GPU before they run, as in a stream of calls
// (the bench's phase traces).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace epx::bench {

// Loads the kernel's code now: a test body calls it before its team's first collective step. Loaded lazily
// at its first launch, it would wait for the kernels already running, other ranks' waiting for this one
// included (seen: LlWaitCycles' single-GPU case timed out on 2026-11-23).
void load_hold_kernel();

// Enqueues on `stream` one thread that spins for `ns` nanoseconds.
void hold_stream(cudaStream_t stream, uint64_t ns);

}  // namespace epx::bench
