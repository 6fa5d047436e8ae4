#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "core/cuda_check.hpp"
#include "transport/device/phase_trace.hpp"
#include "transport/nccl_backend.hpp"
#include "transport/single_gpu_backend.hpp"
#include "transport/team_impl.hpp"
#include "transport/wait_report.hpp"

namespace epx {

using detail::check_cuda;

namespace {

std::unique_ptr<Team::Impl> new_impl(int rank, int nranks, bool single_gpu, const TeamOptions& options) {
  EPX_REQUIRE(nranks >= 1 && nranks <= kMaxNvlinkRanks,
              "a team has 1 to " + std::to_string(kMaxNvlinkRanks) + " ranks, not " + std::to_string(nranks));
  EPX_REQUIRE(rank >= 0 && rank < nranks,
              "rank " + std::to_string(rank) + " is outside [0, " + std::to_string(nranks) + ")");
  EPX_REQUIRE(options.wait_timeout.count() > 0 && options.wait_timeout <= std::chrono::hours(1),
              "TeamOptions::wait_timeout must be positive and at most an hour");
  auto impl = std::make_unique<Team::Impl>();
  impl->rank = rank;
  impl->nranks = nranks;
  impl->single_gpu = single_gpu;
  impl->options = options;
  check_cuda(cudaGetDevice(&impl->device), "cudaGetDevice");
  void* report = nullptr;
  check_cuda(cudaHostAlloc(&report, sizeof(transport::WaitReport), cudaHostAllocMapped), "cudaHostAlloc(wait report)");
  std::memset(report, 0, sizeof(transport::WaitReport));
  impl->report_host = static_cast<transport::WaitReport*>(report);
  void* report_device = nullptr;
  check_cuda(cudaHostGetDevicePointer(&report_device, report, 0), "cudaHostGetDevicePointer(wait report)");
  impl->report_device = static_cast<transport::WaitReport*>(report_device);
#ifdef EPX_PHASE_TRACE
  check_cuda(cudaMalloc(reinterpret_cast<void**>(&impl->trace), sizeof(uint64_t) * transport::kTraceWords),
             "cudaMalloc(phase trace)");
#endif
  return impl;
}

}  // namespace

void Team::Impl::mark_failed() {
  if (failed) return;
  failed = true;
  backend->mark_failed();
}

Team::Impl::~Impl() {
  control = SymmetricMemory();  // before the backend it came from
  backend.reset();
  if (report_host != nullptr) cudaFreeHost(report_host);
  if (trace != nullptr) cudaFree(trace);
}

void Team::Impl::reset_trace(cudaStream_t stream) {
  EPX_REQUIRE(trace != nullptr, "the phase trace needs a build with -DEPX_PHASE_TRACE=ON");
  std::vector<uint64_t> words(transport::kTraceWords, 0);  // the warps' rows: nothing reached
  for (int p = 0; p < transport::kTracePoints; ++p) {      // the team's words: see phase_trace.hpp
    words[std::size_t(p)] = transport::trace_keeps_earliest(transport::TracePoint(p)) ? UINT64_MAX : 0;
  }
  check_cuda(cudaMemcpyAsync(trace, words.data(), sizeof(uint64_t) * words.size(), cudaMemcpyHostToDevice, stream),
             "cudaMemcpyAsync(phase trace reset)");
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize(phase trace reset)");
}

std::vector<uint64_t> Team::Impl::read_trace() {
  EPX_REQUIRE(trace != nullptr, "the phase trace needs a build with -DEPX_PHASE_TRACE=ON");
  std::vector<uint64_t> words(transport::kTraceWords);
  check_cuda(cudaMemcpy(words.data(), trace, sizeof(uint64_t) * words.size(), cudaMemcpyDeviceToHost),
             "cudaMemcpy(phase trace read)");
  return words;
}

transport::SymmetricView Team::Impl::symmetric_view(const SymmetricMemory& memory) const {
  transport::SymmetricView view{};
  for (int r = 0; r < nranks; ++r) view.base[r] = static_cast<char*>(memory.peer(r));
  return view;
}

transport::TeamView Team::Impl::view() const {
  transport::TeamView v{};
  v.rank = rank;
  v.nranks = nranks;
  v.timeout_ns =
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(options.wait_timeout).count());
  v.report = report_device;
  v.control = symmetric_view(control);
  v.trace = trace;
  return v;
}

Team::Team(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  impl_->control = allocate_symmetric(sizeof(transport::ControlRegion));
}

Team::~Team() = default;

UniqueId Team::make_unique_id() { return transport::nccl_unique_id(); }

std::unique_ptr<Team> Team::create_nccl(const UniqueId& id, int rank, int nranks, const TeamOptions& options) {
  detail::ScopedRank scoped(rank);
  auto impl = new_impl(rank, nranks, false, options);
  impl->backend = transport::make_nccl_backend(id, rank, nranks);
  return std::unique_ptr<Team>(new Team(std::move(impl)));
}

std::vector<std::unique_ptr<Team>> Team::create_single_gpu(int nranks, const TeamOptions& options) {
  EPX_REQUIRE(nranks >= 1 && nranks <= kMaxNvlinkRanks, "single-GPU team of " + std::to_string(nranks) + " ranks");
  auto group = transport::make_single_gpu_group(nranks);
  std::vector<std::unique_ptr<Impl>> impls;
  for (int r = 0; r < nranks; ++r) {
    detail::ScopedRank scoped(r);
    impls.push_back(new_impl(r, nranks, true, options));
    impls.back()->backend = transport::make_single_gpu_backend(group, r);
  }
  // The control regions are collective allocations; in this mode one thread may make them for all
  // ranks, because the group hands rank r its slice of the k-th allocation whoever asks first.
  std::vector<std::unique_ptr<Team>> teams;
  for (auto& impl : impls) teams.push_back(std::unique_ptr<Team>(new Team(std::move(impl))));
  return teams;
}

int Team::rank() const { return impl_->rank; }
int Team::size() const { return impl_->nranks; }
int Team::device() const { return impl_->device; }
bool Team::is_single_gpu() const { return impl_->single_gpu; }
const TeamOptions& Team::options() const { return impl_->options; }
bool Team::failed() const { return impl_->failed; }

SymmetricMemory Team::allocate_symmetric(std::size_t bytes) {
  detail::ScopedRank scoped(impl_->rank);
  if (impl_->failed) detail::fail(ErrorKind::invalid_argument, "allocate_symmetric on a failed team");
  EPX_REQUIRE(bytes > 0, "allocate_symmetric of 0 bytes");
  SymmetricAllocation allocation = impl_->backend->allocate(bytes);
  auto backing = std::make_shared<SymmetricMemory::Backing>();
  backing->peers = std::move(allocation.peers);
  backing->release = std::move(allocation.release);
  void* local = backing->peers[impl_->rank];
  return SymmetricMemory(std::move(backing), local, bytes);
}

void Team::check_device_errors() {
  detail::ScopedRank scoped(impl_->rank);
  const transport::WaitReport& report = *impl_->report_host;
  if (std::atomic_ref<const uint32_t>(report.claimed).load() == 0u) return;
  impl_->mark_failed();
  detail::fail(ErrorKind::timeout, transport::describe(report));
}

SymmetricMemory::SymmetricMemory(std::shared_ptr<Backing> backing, void* local, std::size_t bytes)
    : backing_(std::move(backing)), local_(local), bytes_(bytes) {}

SymmetricMemory::SymmetricMemory(SymmetricMemory&& other) noexcept { *this = std::move(other); }

SymmetricMemory& SymmetricMemory::operator=(SymmetricMemory&& other) noexcept {
  if (this != &other) {
    backing_ = std::move(other.backing_);
    local_ = std::exchange(other.local_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

SymmetricMemory::~SymmetricMemory() = default;

void* SymmetricMemory::peer(int r) const {
  EPX_REQUIRE(backing_ != nullptr, "SymmetricMemory::peer on an empty SymmetricMemory");
  EPX_REQUIRE(r >= 0 && r < static_cast<int>(backing_->peers.size()),
              "SymmetricMemory::peer(" + std::to_string(r) + ")");
  return backing_->peers[r];
}

}  // namespace epx
