#include "api/call_order.hpp"

#include <string>

#include "core/cuda_check.hpp"
#include "core/rank_context.hpp"

namespace epx::api {

using detail::check_cuda;

CallOrder::CallOrder(Team& team) : team_(team) {
  check_cuda(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  check_cuda(cudaEventCreateWithFlags(&last_call_, cudaEventDisableTiming), "cudaEventCreate");
  check_cuda(cudaEventCreateWithFlags(&caller_ready_, cudaEventDisableTiming), "cudaEventCreate");
}

CallOrder::~CallOrder() {
  if (caller_ready_ != nullptr) cudaEventDestroy(caller_ready_);
  if (last_call_ != nullptr) cudaEventDestroy(last_call_);
  if (comm_stream_ != nullptr) cudaStreamDestroy(comm_stream_);
}

cudaStream_t CallOrder::begin(const Streams& streams, const char* what) {
  int device = -1;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  EPX_REQUIRE(device == team_.device(), std::string(what) + " call with CUDA device " + std::to_string(device) +
                                            " current; this rank's team is on device " +
                                            std::to_string(team_.device()));
  team_.check_device_errors();  // an expired wait of an earlier call: report it now, once
  EPX_REQUIRE(!team_.failed(), std::string(what) + " call on a failed team (a wait expired earlier)");
  cudaStream_t stream = streams.stream;
  if (streams.async) {
    cudaEvent_t ready = streams.previous_event;
    if (ready == nullptr) {  // a wait takes the event as recorded now: one event serves every call
      ready = caller_ready_;
      check_cuda(cudaEventRecord(ready, streams.stream), "recording the caller's stream");
    }
    check_cuda(cudaStreamWaitEvent(comm_stream_, ready, 0),
               "ordering the communication stream after the caller's stream");
    stream = comm_stream_;
  }
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing");
  capturing_ = status != cudaStreamCaptureStatusNone;
  if (!capturing_) check_cuda(cudaStreamWaitEvent(stream, last_call_, 0), "waiting for the previous call");
  return stream;
}

cudaEvent_t CallOrder::end(const Streams& streams, cudaStream_t stream) {
  if (!capturing_) check_cuda(cudaEventRecord(last_call_, stream), "cudaEventRecord");
  if (!streams.async) return nullptr;
  cudaEvent_t finished = nullptr;
  check_cuda(cudaEventCreateWithFlags(&finished, cudaEventDisableTiming), "cudaEventCreate");
  check_cuda(cudaEventRecord(finished, stream), "cudaEventRecord");
  return finished;
}

}  // namespace epx::api
