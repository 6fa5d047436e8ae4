// The stream discipline every buffer call shares (HtBuffer, LlBuffer):
//   * the checks at the start of a call: the team's device is current, the team has not failed (an
//     expired wait of an earlier call is reported here, once);
//   * where the call runs: the caller's stream, or the buffer's communication stream (Streams::async);
//   * calls on one buffer run in the order they were made, whatever their streams: each waits for the
//     event the previous one recorded (not inside a graph capture, where the capture orders them);
//   * the `finished` event of an async call.
#pragma once

#include <cuda_runtime_api.h>

#include "epx/streams.hpp"
#include "epx/team.hpp"

namespace epx::api {

class CallOrder {
 public:
  explicit CallOrder(Team& team);
  ~CallOrder();
  CallOrder(const CallOrder&) = delete;
  CallOrder& operator=(const CallOrder&) = delete;

  // Checks, then returns the stream the call's kernels go on. `what` names the call in errors.
  cudaStream_t begin(const Streams& streams, const char* what);
  // After the call's last launch: returns Streams' `finished` event with async, else null.
  cudaEvent_t end(const Streams& streams, cudaStream_t stream);
  // The buffer's own stream (Streams::async calls run there; set-up work may too).
  cudaStream_t comm_stream() const { return comm_stream_; }

 private:
  Team& team_;
  cudaStream_t comm_stream_ = nullptr;
  cudaEvent_t last_call_ = nullptr;
  cudaEvent_t caller_ready_ = nullptr;  // an async call without previous_event: the caller's stream so far
  bool capturing_ = false;              // the stream of the current call (the last begin) is being captured
};

}  // namespace epx::api
