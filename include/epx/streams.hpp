// epx::Streams — where a dispatch or combine call runs (HtBuffer and LlBuffer alike).
#pragma once

#include <cuda_runtime_api.h>

namespace epx {

// By default a call runs on `stream`. With async = true it runs on the buffer's own communication
// stream after waiting for `stream` (or for `previous_event` if given), and the result's `finished`
// event is recorded on the communication stream: the caller waits on it before using the outputs, and
// destroys it (cudaEventDestroy) when done. `previous_event` stays the caller's.
struct Streams {
  cudaStream_t stream = nullptr;
  bool async = false;
  cudaEvent_t previous_event = nullptr;
};

}  // namespace epx
