// The one file that sets NCCL up (its host API changes between 2.28, 2.29 and 2.30).
//
// Set-up: unique id (rank 0) -> ncclCommInitRankConfig -> per allocation: ncclMemAlloc (cuMem memory,
// which windows require) -> ncclCommWindowRegister(NCCL_WIN_COLL_SYMMETRIC) -> the LSA address of each
// rank's copy (lsa_pointers.cu). Kernels then use plain loads and stores over NVLink and our own
// bounded flags and barriers (src/transport/device/): NCCL's device barriers wait without a bound.
// NVLink multicast (NVLS) is never used: epx turns it off for its communicators.
#include <nccl.h>
#include <nccl_device.h>  // ncclTeamLsa

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <source_location>
#include <string>

#include "core/cuda_check.hpp"
#include "transport/lsa_pointers.hpp"
#include "transport/nccl_backend.hpp"

namespace epx::transport {
namespace {

using detail::check_cuda;

void check_nccl(ncclResult_t status, const char* what, std::source_location where = std::source_location::current()) {
  if (status == ncclSuccess) return;
  detail::fail(ErrorKind::nccl, std::string(what) + " failed: " + ncclGetErrorString(status) + " at " +
                                    where.file_name() + ":" + std::to_string(where.line()));
}

std::string version_string(int code) {
  // NCCL >= 2.9 encodes X.Y.Z as X*10000 + Y*100 + Z.
  return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." + std::to_string(code % 100);
}

// The device structs of NCCL 2.28 are unversioned: a kernel compiled against one patch level may
// misread another's windows. Refuse to start rather than corrupt memory.
void require_matching_nccl() {
  int runtime = 0;
  check_nccl(ncclGetVersion(&runtime), "ncclGetVersion");
  if (runtime != NCCL_VERSION_CODE) {
    detail::fail(ErrorKind::nccl,
                 "the NCCL library loaded at run time is " + version_string(runtime) +
                     " but epx was compiled against " + version_string(NCCL_VERSION_CODE) +
                     "; NCCL's device API needs the same version: put the directory of the matching "
                     "libnccl.so.2 first on LD_LIBRARY_PATH (for PyTorch's wheel: python3 -c \"import nvidia.nccl "
                     "as m; print(m.__path__[0] + '/lib')\")");
  }
}

constexpr std::size_t kWindowAlignment = NCCL_WIN_REQUIRED_ALIGNMENT;

class NcclBackend final : public Backend {
 public:
  NcclBackend(const UniqueId& id, int rank, int nranks) : rank_(rank), nranks_(nranks) {
    require_matching_nccl();
    setenv("NCCL_NVLS_ENABLE", "0", 1);  // never NVLink multicast (see the file comment)
    ncclUniqueId nccl_id;
    static_assert(sizeof(nccl_id.internal) == sizeof(id.bytes));
    std::memcpy(nccl_id.internal, id.bytes.data(), sizeof(nccl_id.internal));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 1;
    check_nccl(ncclCommInitRankConfig(&comm_, nranks, nccl_id, rank, &config), "ncclCommInitRankConfig");
    const ncclTeam_t lsa = ncclTeamLsa(comm_);
    if (lsa.nRanks != nranks) {
      ncclCommAbort(comm_);
      detail::fail(ErrorKind::invalid_argument,
                   "only " + std::to_string(lsa.nRanks) + " of the " + std::to_string(nranks) +
                       " ranks share this rank's NVLink domain; epx needs all ranks in one NVLink domain "
                       "(internode teams are not supported yet)");
    }
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  }

  ~NcclBackend() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (comm_ == nullptr) return;
    if (failed_) {
      ncclCommAbort(comm_);  // peers may be gone: do not wait for them
    } else if (ncclCommFinalize(comm_) != ncclSuccess || ncclCommDestroy(comm_) != ncclSuccess) {
      std::fprintf(stderr, "epx rank %d: NCCL communicator did not shut down cleanly\n", rank_);
    }
  }

  SymmetricAllocation allocate(std::size_t requested) override {
    const std::size_t bytes = (requested + kWindowAlignment - 1) / kWindowAlignment * kWindowAlignment;
    require_same_size_everywhere(bytes);
    void* memory = nullptr;
    check_nccl(ncclMemAlloc(&memory, bytes), "ncclMemAlloc");
    // Zero before registering: registration is collective, so no peer can signal into this memory
    // before every rank has zeroed its copy.
    check_cuda(cudaMemsetAsync(memory, 0, bytes, stream_), "cudaMemsetAsync(symmetric memory)");
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    ncclWindow_t window = nullptr;
    check_nccl(ncclCommWindowRegister(comm_, memory, bytes, &window, NCCL_WIN_COLL_SYMMETRIC),
               "ncclCommWindowRegister");
    SymmetricAllocation allocation;
    allocation.peers = resolve_lsa_pointers(window, nranks_);
    allocation.release = [this, window, memory] {
      if (!failed_ && ncclCommWindowDeregister(comm_, window) != ncclSuccess) {
        std::fprintf(stderr, "epx rank %d: ncclCommWindowDeregister failed\n", rank_);
      }
      ncclMemFree(memory);
    };
    return allocation;
  }

  void mark_failed() override { failed_ = true; }

 private:
  // Symmetric windows must have the same size on every rank; a mismatch is a caller error that NCCL
  // would not report clearly, so compare first.
  void require_same_size_everywhere(std::size_t bytes) {
    uint64_t* sizes = nullptr;
    check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&sizes), sizeof(uint64_t) * (nranks_ + 1), stream_),
               "cudaMallocAsync");
    const uint64_t mine = bytes;
    check_cuda(cudaMemcpyAsync(sizes + nranks_, &mine, sizeof(mine), cudaMemcpyHostToDevice, stream_),
               "cudaMemcpyAsync");
    check_nccl(ncclAllGather(sizes + nranks_, sizes, 1, ncclUint64, comm_, stream_), "ncclAllGather(sizes)");
    std::vector<uint64_t> all(nranks_);
    check_cuda(cudaMemcpyAsync(all.data(), sizes, sizeof(uint64_t) * nranks_, cudaMemcpyDeviceToHost, stream_),
               "cudaMemcpyAsync");
    check_cuda(cudaFreeAsync(sizes, stream_), "cudaFreeAsync");
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    for (int r = 0; r < nranks_; ++r) {
      if (all[r] != bytes) {
        detail::fail(ErrorKind::invalid_argument, "allocate_symmetric: rank " + std::to_string(r) + " asked for " +
                                                      std::to_string(all[r]) + " bytes, this rank for " +
                                                      std::to_string(bytes) + " (it must be the same on every rank)");
      }
    }
  }

  int rank_;
  int nranks_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool failed_ = false;
};

}  // namespace

UniqueId nccl_unique_id() {
  require_matching_nccl();
  ncclUniqueId nccl_id;
  check_nccl(ncclGetUniqueId(&nccl_id), "ncclGetUniqueId");
  UniqueId id;
  std::memcpy(id.bytes.data(), nccl_id.internal, sizeof(nccl_id.internal));
  return id;
}

std::unique_ptr<Backend> make_nccl_backend(const UniqueId& id, int rank, int nranks) {
  return std::make_unique<NcclBackend>(id, rank, nranks);
}

}  // namespace epx::transport
