// Single-GPU multi-rank mode (tests only): R ranks in one process on one GPU. The k-th collective
// allocation of the group is one cudaMalloc of R slices; rank r's copy is slice r, and every rank's
// kernels address every slice directly. The allocation is made and zeroed by whichever rank asks
// first, under the group's lock, before any rank gets its address; it is freed when the last rank
// releases it.
#include <cuda_runtime_api.h>

#include <mutex>
#include <string>
#include <vector>

#include "core/cuda_check.hpp"
#include "transport/single_gpu_backend.hpp"

namespace epx::transport {

class SingleGpuGroup {
 public:
  explicit SingleGpuGroup(int nranks) : nranks_(nranks) {}

  SymmetricAllocation allocate(int rank, std::size_t bytes) {
    std::lock_guard lock(mutex_);
    const std::size_t index = next_[rank]++;
    constexpr std::size_t kAlignment = 4096;
    const std::size_t slice = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    if (index == slots_.size()) {
      Slot slot;
      slot.slice_bytes = slice;
      slot.users = nranks_;
      detail::check_cuda(cudaMalloc(&slot.base, slice * nranks_), "cudaMalloc(single-GPU symmetric memory)");
      detail::check_cuda(cudaMemset(slot.base, 0, slice * nranks_), "cudaMemset(single-GPU symmetric memory)");
      detail::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      slots_.push_back(slot);
    }
    Slot& slot = slots_[index];
    EPX_REQUIRE(slot.slice_bytes == slice, "allocate_symmetric: ranks asked for different sizes (" +
                                               std::to_string(slot.slice_bytes) + " and " + std::to_string(slice) +
                                               " bytes after rounding); it must be the same on every rank");
    SymmetricAllocation allocation;
    for (int r = 0; r < nranks_; ++r) allocation.peers.push_back(static_cast<char*>(slot.base) + slot.slice_bytes * r);
    allocation.release = [this, index] { release(index); };
    return allocation;
  }

 private:
  struct Slot {
    void* base = nullptr;
    std::size_t slice_bytes = 0;
    int users = 0;
  };

  void release(std::size_t index) {
    std::lock_guard lock(mutex_);
    Slot& slot = slots_[index];
    if (--slot.users == 0) {
      cudaFree(slot.base);
      slot.base = nullptr;
    }
  }

  int nranks_;
  std::mutex mutex_;
  std::vector<Slot> slots_;
  std::vector<std::size_t> next_ = std::vector<std::size_t>(static_cast<std::size_t>(nranks_), 0);
};

namespace {

class SingleGpuBackend final : public Backend {
 public:
  SingleGpuBackend(std::shared_ptr<SingleGpuGroup> group, int rank) : group_(std::move(group)), rank_(rank) {}
  SymmetricAllocation allocate(std::size_t bytes) override { return group_->allocate(rank_, bytes); }
  void mark_failed() override {}  // nothing here waits for peers

 private:
  std::shared_ptr<SingleGpuGroup> group_;
  int rank_;
};

}  // namespace

std::shared_ptr<SingleGpuGroup> make_single_gpu_group(int nranks) { return std::make_shared<SingleGpuGroup>(nranks); }

std::unique_ptr<Backend> make_single_gpu_backend(std::shared_ptr<SingleGpuGroup> group, int rank) {
  return std::make_unique<SingleGpuBackend>(std::move(group), rank);
}

}  // namespace epx::transport
