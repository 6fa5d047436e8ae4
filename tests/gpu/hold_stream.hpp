// A kernel that keeps a stream busy for a while: a rank that comes late to a call, or a call made while
// its stream is still busy.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace epx::test {

// Loads the kernel's code now: a body calls it before its team's first collective step. Loaded lazily at
// its first launch, it would wait for the kernels already running, other ranks' waiting for this one
// included (seen: LlWaitCycles' single-GPU case timed out on 2026-11-23).
void load_hold_kernel();

// Enqueues on `stream` one thread that spins for `ns` nanoseconds.
void hold_stream(cudaStream_t stream, uint64_t ns);

}  // namespace epx::test
