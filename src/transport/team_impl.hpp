// Inside a Team: the transport backend that owns the memory, and the device view kernels receive.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "epx/team.hpp"
#include "transport/device/team_view.hpp"

namespace epx {

// One collective allocation, as a backend returns it: every rank's address as seen from this GPU, and
// how to give it back.
struct SymmetricAllocation {
  std::vector<void*> peers;       // peers[r]: rank r's copy
  std::function<void()> release;  // collective unless the team has failed
};

struct SymmetricMemory::Backing {
  std::vector<void*> peers;
  std::function<void()> release;
  ~Backing() {
    if (release) release();
  }
};

namespace transport {

// How ranks find each other's memory. Two implementations: NCCL windows (nccl_backend.cpp) and
// slices of one allocation on one GPU (single_gpu_backend.cpp).
class Backend {
 public:
  virtual ~Backend() = default;
  // Collective. Returns zeroed memory of `bytes` on every rank, visible to every rank's kernels.
  virtual SymmetricAllocation allocate(std::size_t bytes) = 0;
  // Called once when the team fails: later releases must not wait for peers.
  virtual void mark_failed() = 0;
};

}  // namespace transport

struct Team::Impl {
  int rank = 0;
  int nranks = 0;
  int device = 0;
  bool single_gpu = false;
  TeamOptions options;
  std::unique_ptr<transport::Backend> backend;
  transport::WaitReport* report_host = nullptr;    // host-mapped, see WaitReport
  transport::WaitReport* report_device = nullptr;  // the same memory, device address
  SymmetricMemory control;                         // a transport::ControlRegion on every rank
  uint64_t* trace = nullptr;                       // phase-trace words (EPX_PHASE_TRACE builds)
  bool failed = false;

  ~Impl();
  // After a wait expired (device or host): later collective work refuses, teardown stops waiting for peers.
  void mark_failed();
  transport::TeamView view() const;
  // Phase trace (transport/device/phase_trace.hpp; EPX_PHASE_TRACE builds, else they throw): every
  // point back to "not reached", in `stream`'s order and landed on return; then, after the traced
  // call (its stream synchronised), the stamps (ns; a point not reached reads 0 or UINT64_MAX).
  void reset_trace(cudaStream_t stream);
  std::vector<uint64_t> read_trace();
  transport::SymmetricView symmetric_view(const SymmetricMemory& memory) const;
};

}  // namespace epx
