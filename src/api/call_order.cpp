#include "api/call_order.hpp"

#include <string>

#include "core/cuda_check.hpp"
#include "core/rank_context.hpp"

namespace epx::api {

using detail::check_cuda;

CallOrder::CallOrder(Team& team) : team_(team) {
  check_cuda(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  check_cuda(cudaEventCreateWithFlags(&last_call_, cudaEventDisableTiming), "cudaEventCreate");
}

CallOrder::~CallOrder() {
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
    cudaError_t status = cudaSuccess;
    if (ready == nullptr) {
      status = cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
      if (status == cudaSuccess) status = cudaEventRecord(ready, streams.stream);
    }
    if (status == cudaSuccess) status = cudaStreamWaitEvent(comm_stream_, ready, 0);
    if (streams.previous_event == nullptr && ready != nullptr) cudaEventDestroy(ready);
    check_cuda(status, "ordering the communication stream after the caller's stream");
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
