#include "bench/kernel_clock.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>

#include "bench/device_data.hpp"
#include "bench/team_sync.hpp"
#include "core/cuda_check.hpp"

#if EPX_BENCH_HAS_CUPTI
#include <cupti_activity.h>
#include <cupti_version.h>
#endif

namespace epx::bench {

#if EPX_BENCH_HAS_CUPTI

namespace {

// What one kernel record says (CUpti_ActivityKernel10: CUPTI 13's kernel record).
struct KernelRecord {
  uint32_t correlation;  // the launching API call's: every kernel of one graph launch shares it
  uint32_t graph;        // 0 for a kernel launched outside a graph
  uint64_t start_ns, end_ns;
};

// CUPTI calls its buffer callbacks as plain functions, so the records go to this one place (open()
// succeeds once per process).
std::mutex records_mutex;
std::vector<KernelRecord> records;
using NextRecord = CUptiResult (*)(uint8_t*, size_t, CUpti_Activity**);
NextRecord next_record = nullptr;

constexpr std::size_t kActivityBufferBytes = 1 << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kActivityBufferBytes));
  *size = *buffer != nullptr ? kActivityBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid_bytes) {
  {
    const std::lock_guard<std::mutex> lock(records_mutex);
    CUpti_Activity* record = nullptr;
    while (next_record(buffer, valid_bytes, &record) == CUPTI_SUCCESS) {
      if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      records.push_back({k->correlationId, k->graphId, k->start, k->end});
    }
  }
  std::free(buffer);
}

}  // namespace

// The library stays loaded for the process's life (never dlclose'd): CUPTI stays attached to the driver
// once its activity was enabled.
struct KernelClock::Library {
  void* handle = nullptr;
  CUptiResult (*get_version)(uint32_t*) = nullptr;
  CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc) = nullptr;
  CUptiResult (*enable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*disable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*flush_all)(uint32_t) = nullptr;
};

std::unique_ptr<KernelClock> KernelClock::open(std::string& why_not) {
  static bool opened = false;  // CUPTI's callbacks are registered once per process
  if (opened) {
    why_not = "CUPTI was opened before in this process";
    return nullptr;
  }
  auto lib = std::make_unique<Library>();
  // The loader's path first, then where the CUDA toolkit installs CUPTI (it is not always on that path).
  const char* named = std::getenv("EPX_CUPTI_LIBRARY");
  for (const char* name : {named, "libcupti.so.13", "/usr/local/cuda/targets/x86_64-linux/lib/libcupti.so.13",
                           "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13"}) {
    if (name != nullptr && (lib->handle = dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
  }
  if (lib->handle == nullptr) {
    why_not = "no libcupti.so.13 found (EPX_CUPTI_LIBRARY may name it)";
    return nullptr;
  }
  const auto find = [&](auto& f, const char* symbol) {
    f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(lib->handle, symbol));
    return f != nullptr;
  };
  if (!find(lib->get_version, "cuptiGetVersion") || !find(lib->register_callbacks, "cuptiActivityRegisterCallbacks") ||
      !find(lib->enable, "cuptiActivityEnable") || !find(lib->disable, "cuptiActivityDisable") ||
      !find(lib->flush_all, "cuptiActivityFlushAll") || !find(next_record, "cuptiActivityGetNextRecord")) {
    why_not = "the CUPTI library lacks an activity function";
    return nullptr;
  }
  uint32_t version = 0;
  // The kernel records are read as CUPTI 13's layout: refuse another series.
  if (lib->get_version(&version) != CUPTI_SUCCESS || version / 10000 != CUPTI_API_VERSION / 10000) {
    why_not = "CUPTI API version " + std::to_string(version) + ", built for " + std::to_string(CUPTI_API_VERSION);
    return nullptr;
  }
  if (lib->register_callbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) {
    why_not = "cuptiActivityRegisterCallbacks failed";
    return nullptr;
  }
  opened = true;
  return std::unique_ptr<KernelClock>(new KernelClock(std::move(lib)));
}

std::vector<double> KernelClock::graph_launch_spans(cudaStream_t stream, const std::function<void()>& run) {
  {
    const std::lock_guard<std::mutex> lock(records_mutex);
    records.clear();
  }
  if (library_->enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) return {};
  try {
    run();
    detail::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  } catch (...) {
    library_->disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    throw;
  }
  library_->flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  library_->disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  std::map<uint32_t, std::pair<uint64_t, uint64_t>> launches;  // correlation -> (first start, last end)
  {
    const std::lock_guard<std::mutex> lock(records_mutex);
    for (const KernelRecord& k : records) {
      if (k.graph == 0 || k.end_ns <= k.start_ns) continue;
      auto [it, added] = launches.try_emplace(k.correlation, k.start_ns, k.end_ns);
      if (!added) it->second = {std::min(it->second.first, k.start_ns), std::max(it->second.second, k.end_ns)};
    }
    records.clear();
  }
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& [correlation, span] : launches) spans.push_back(span);
  std::sort(spans.begin(), spans.end());  // launch order: a stream's graph launches run one after another
  std::vector<double> us;
  for (const auto& [start, end] : spans) us.push_back(double(end - start) * 1e-3);
  return us;
}

#else  // built without CUPTI's headers

struct KernelClock::Library {};

std::unique_ptr<KernelClock> KernelClock::open(std::string& why_not) {
  why_not = "the bench was built without CUPTI's headers";
  return nullptr;
}

std::vector<double> KernelClock::graph_launch_spans(cudaStream_t, const std::function<void()>&) { return {}; }

#endif

KernelClock::KernelClock(std::unique_ptr<Library> library) : library_(std::move(library)) {}
KernelClock::~KernelClock() = default;

std::unique_ptr<KernelClock> open_kernel_clock(Team& team, std::string& why_not) {
  std::unique_ptr<KernelClock> clock = KernelClock::open(why_not);
  const Stream stream = new_stream();
  const std::vector<double> opened = all_gather(team, stream.get(), {clock != nullptr ? 1.0 : 0.0});
  if (std::all_of(opened.begin(), opened.end(), [](double o) { return o != 0; })) return clock;
  if (clock != nullptr) why_not = "another rank has no CUPTI";
  return nullptr;
}

Timing graph_kernel_time(KernelClock* clock, cudaStream_t stream, int warmup, int replays,
                         const std::function<void()>& run) {
  if (clock == nullptr) return {};
  std::vector<double> spans = clock->graph_launch_spans(stream, run);
  if (spans.size() != std::size_t(warmup + replays)) return {};
  spans.erase(spans.begin(), spans.begin() + warmup);
  return summarize(std::move(spans));
}

}  // namespace epx::bench
