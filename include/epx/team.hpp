// epx::Team — the ranks that exchange tokens, and the memory they share.
//
// A team is R ranks, one GPU each, whose GPUs reach each other's memory over NVLink. It is built in
// one of two ways:
//   * Team::create_nccl — one process per GPU (the production set-up). Rank 0 makes a UniqueId,
//     every rank receives it out of band (a launcher, torch.distributed, a file) and calls
//     create_nccl collectively. NCCL's symmetric windows give each rank the others' addresses.
//   * Team::create_single_gpu — R "ranks" on the current GPU inside one process, each a slice of
//     one allocation (tests only: it checks the R-rank logic on a 1-GPU machine; timings from it
//     mean nothing). Drive each returned team from its own host thread, like separate processes.
//
// Collective calls (create_*, allocate_symmetric, destroying a SymmetricMemory) must be made by
// every rank of the team, in the same order, with the same sizes.
//
// Every device-side wait of a team is bounded by TeamOptions::wait_timeout. A kernel whose wait
// expires records who waited for whom and returns; check_device_errors() turns that record into an
// epx::Error. After a timeout the team is marked failed: further collective work throws, and
// destruction aborts the communicator instead of waiting for peers that may be gone.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <memory>
#include <vector>

#include "epx/error.hpp"
#include "epx/export.hpp"

namespace epx {

// The largest team whose ranks share memory over NVLink (an NVL72 domain).
inline constexpr int kMaxNvlinkRanks = 72;

// The bootstrap token of an NCCL team: 128 opaque bytes, made once by rank 0 and shared out of band.
struct UniqueId {
  std::array<char, 128> bytes{};
};

struct TeamOptions {
  // Bound on every device-side wait (flags, barriers). Far above any normal wait; a wait this long
  // means a peer is dead, hung or not calling the same operation.
  std::chrono::milliseconds wait_timeout{5000};
};

class SymmetricMemory;

class EPX_API Team {
 public:
  // Makes a new bootstrap token. Call on rank 0 only; it starts NCCL's bootstrap listener in this process.
  static UniqueId make_unique_id();

  // One rank of an NCCL team on the calling thread's current CUDA device. Collective.
  // Refuses to start when the NCCL loaded at run time is not the version epx was compiled against,
  // or when the ranks do not all share one NVLink domain.
  static std::unique_ptr<Team> create_nccl(const UniqueId& id, int rank, int nranks, const TeamOptions& options = {});

  // `nranks` ranks on the calling thread's current CUDA device, in this process (tests).
  static std::vector<std::unique_ptr<Team>> create_single_gpu(int nranks, const TeamOptions& options = {});

  ~Team();
  Team(const Team&) = delete;
  Team& operator=(const Team&) = delete;

  int rank() const;
  int size() const;
  int device() const;
  bool is_single_gpu() const;
  const TeamOptions& options() const;

  // Collective: `bytes` of device memory on every rank, zeroed, which every rank's kernels can address.
  SymmetricMemory allocate_symmetric(std::size_t bytes);

  // Throws epx::Error (kind timeout) if a kernel of this team recorded an expired wait. Call after the
  // stream that ran the kernels was synchronised. Once it has thrown, the team stays failed.
  void check_device_errors();
  bool failed() const;

  // Implementation, shared with the library's internals (src/transport/team_impl.hpp).
  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  explicit Team(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Device memory of the same size on every rank of a team (move-only; freed collectively when destroyed,
// so it must be destroyed by every rank, before its team).
class EPX_API SymmetricMemory {
 public:
  SymmetricMemory() = default;
  SymmetricMemory(SymmetricMemory&& other) noexcept;
  SymmetricMemory& operator=(SymmetricMemory&& other) noexcept;
  ~SymmetricMemory();

  void* local() const { return local_; }
  std::size_t bytes() const { return bytes_; }
  // Address of rank r's copy, valid in kernels running on this rank's GPU.
  void* peer(int r) const;

 private:
  friend class Team;
  struct Backing;  // how the memory is held (NCCL window, or a slice of one allocation)
  SymmetricMemory(std::shared_ptr<Backing> backing, void* local, std::size_t bytes);

  std::shared_ptr<Backing> backing_;
  void* local_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace epx
