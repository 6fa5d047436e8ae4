// The C ABI (include/epx/epx.h) over the C++ API. Thin on purpose: every check of an argument's meaning
// lives in the C++ layer; this file only converts structs, owns the opaque objects, and turns every
// exception into a status plus a per-thread message. What it checks itself is only what the C++ layer
// cannot see: null pointers to structs and objects, struct sizes, and enum values.
#include "epx/epx.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <utility>

#include <nccl.h>

#include "epx/error.hpp"
#include "epx/ht.hpp"
#include "epx/ll.hpp"
#include "epx/team.hpp"
#include "epx/tensor.hpp"
#include "epx/version.hpp"

struct epx_team {
  std::unique_ptr<epx::Team> team;
};
struct epx_ht_buffer {
  std::unique_ptr<epx::HtBuffer> buffer;
};
struct epx_ht_handle {
  std::shared_ptr<const epx::HtHandle> handle;
};
struct epx_ll_buffer {
  std::unique_ptr<epx::LlBuffer> buffer;
};
struct epx_ll_receive {
  std::function<void()> step;  // refuses a second run itself (LlBuffer's receive step)
};

namespace {

using epx::Error;
using epx::ErrorKind;

// The last failure on this thread (epx_last_error, epx_last_error_rank).
thread_local std::string t_message;
thread_local int t_rank = -1;

epx_status status_of(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::invalid_argument:
      return EPX_ERROR_INVALID_ARGUMENT;
    case ErrorKind::cuda:
      return EPX_ERROR_CUDA;
    case ErrorKind::nccl:
      return EPX_ERROR_NCCL;
    case ErrorKind::timeout:
      return EPX_ERROR_TIMEOUT;
    case ErrorKind::system:
      return EPX_ERROR_SYSTEM;
    case ErrorKind::internal:
      return EPX_ERROR_INTERNAL;
  }
  return EPX_ERROR_INTERNAL;
}

epx_status record(epx_status status, int rank, const char* message) {
  t_message = message;
  t_rank = rank;
  return status;
}

// Runs `body`, converting what it throws. Errors of this layer itself have no rank to name.
template <typename Body>
epx_status guarded(Body&& body) noexcept {
  try {
    body();
    return EPX_SUCCESS;
  } catch (const Error& e) {
    return record(status_of(e.kind()), e.rank(), e.what());
  } catch (const std::bad_alloc&) {
    return record(EPX_ERROR_SYSTEM, -1, "epx: out of host memory");
  } catch (const std::exception& e) {
    return record(EPX_ERROR_INTERNAL, -1, (std::string("epx: unexpected exception: ") + e.what()).c_str());
  } catch (...) {
    return record(EPX_ERROR_INTERNAL, -1, "epx: unexpected exception of unknown type");
  }
}

[[noreturn]] void fail(const std::string& what) { throw Error(ErrorKind::invalid_argument, -1, what); }

template <typename T>
T& deref(T* p, const char* name) {
  if (p == nullptr) fail(std::string(name) + " is a null pointer");
  return *p;
}

// An input struct: its first struct_size bytes over `defaults` (fields the caller does not know keep them).
template <typename T>
T read_struct(const T* in, const char* name, const T& defaults) {
  if (in == nullptr) fail(std::string(name) + " is a null pointer");
  if (in->struct_size < sizeof(std::size_t) || in->struct_size > sizeof(T)) {
    fail(std::string(name) + ".struct_size is " + std::to_string(in->struct_size) + "; this library knows " +
         std::to_string(sizeof(T)) + " bytes (set it with sizeof, or EPX_*_INIT; a larger size needs a newer epx)");
  }
  T out = defaults;
  std::memcpy(static_cast<void*>(&out), in, in->struct_size);
  return out;
}

// An output struct: checks its size; write_struct copies at most that many bytes back.
template <typename T>
std::size_t output_size(const T* out, const char* name) {
  if (out == nullptr) fail(std::string(name) + " is a null pointer");
  if (out->struct_size < sizeof(std::size_t) || out->struct_size > sizeof(T)) {
    fail(std::string(name) + ".struct_size is " + std::to_string(out->struct_size) + "; this library knows " +
         std::to_string(sizeof(T)) + " bytes");
  }
  return out->struct_size;
}

template <typename T>
void write_struct(T* out, std::size_t size, T value) {
  value.struct_size = size;
  std::memcpy(static_cast<void*>(out), &value, size);
}

epx::TensorRef to_ref(const epx_tensor& t, const char* name) {
  if (t.dtype < EPX_BF16 || t.dtype > EPX_BOOL)
    fail(std::string(name) + " has an unknown dtype " + std::to_string(t.dtype));
  return epx::TensorRef{t.data, static_cast<epx::ScalarType>(t.dtype), t.rows, t.cols, t.row_stride, t.col_stride};
}

epx_tensor from_ref(const epx::TensorRef& t) {
  return epx_tensor{t.data, int32_t(t.type), t.rows, t.cols, t.row_stride, t.col_stride};
}

epx::Streams to_streams(const epx_streams* s) {
  if (s == nullptr) return {};
  const epx_streams in = read_struct(s, "streams", epx_streams EPX_STREAMS_INIT);
  return epx::Streams{in.stream, in.async != 0, in.previous_event};
}

epx::HtBufferOptions to_ht_options(const epx_ht_options& o) {
  epx::HtBufferOptions options{o.max_tokens_per_rank, o.hidden, o.max_topk, o.num_experts, o.handle_blocks};
  options.combine_output = o.combine_output != 0;
  return options;
}

epx::LlBufferOptions to_ll_options(const epx_ll_options& o) {
  return epx::LlBufferOptions{o.max_tokens_per_rank, o.hidden, o.max_topk, o.num_experts, o.mask_on_timeout != 0};
}

epx::LlHandle to_ll_handle(const epx_ll_handle& h) {
  epx::LlHandle out;
  out.buffer = h.buffer;
  out.set = h.set;
  out.generation = h.generation;
  out.num_tokens = h.num_tokens;
  out.topk = h.topk;
  out.hidden = h.hidden;
  out.has_weights = h.has_weights != 0;
  return out;
}

epx_ll_handle from_ll_handle(const epx::LlHandle& h) {
  return epx_ll_handle{h.buffer, h.set, h.generation, h.num_tokens, h.topk, h.hidden, h.has_weights ? 1 : 0};
}

epx_ll_receive* wrap_receive(std::function<void()> step) {
  if (!step) return nullptr;
  return new epx_ll_receive{std::move(step)};
}

// What the HT and LL buffers' entry points share (Wrapper: epx_ht_buffer or epx_ll_buffer).
template <typename Wrapper>
epx_status buffer_bytes(const Wrapper* buffer, size_t* out) {
  return guarded([&] { deref(out, "out") = deref(buffer, "buffer").buffer->buffer_bytes(); });
}

template <typename Wrapper>
epx_status get_num_sms(const Wrapper* buffer, int* out) {
  return guarded([&] { deref(out, "out") = deref(buffer, "buffer").buffer->config().num_sms; });
}

template <typename Wrapper>
epx_status set_num_sms(Wrapper* buffer, int num_sms) {
  return guarded([&] {
    auto& b = *deref(buffer, "buffer").buffer;
    auto config = b.config();
    config.num_sms = num_sms;
    b.set_config(config);
  });
}

template <typename Wrapper>
epx_status check_errors(Wrapper* buffer) {
  return guarded([&] { deref(buffer, "buffer").buffer->check_errors(); });
}

template <typename Owned>
epx_status destroy(Owned* object) {
  return guarded([&] { delete object; });
}

static_assert(sizeof(epx_ll_range) == sizeof(epx::LlRange) &&
                  offsetof(epx_ll_range, count) == offsetof(epx::LlRange, count) &&
                  offsetof(epx_ll_range, begin) == offsetof(epx::LlRange, begin),
              "epx_ll_range mirrors epx::LlRange");
static_assert(sizeof(epx_unique_id) == sizeof(epx::UniqueId), "epx_unique_id mirrors epx::UniqueId");

}  // namespace

extern "C" {

// ---- errors and library information ----------------------------------------------------------------------

int epx_abi_version(void) { return EPX_ABI_VERSION; }
const char* epx_version(void) { return EPX_VERSION_STRING; }
int epx_nccl_version_compiled(void) { return NCCL_VERSION_CODE; }
const char* epx_cuda_architectures(void) { return EPX_CUDA_ARCHITECTURES; }
const char* epx_last_error(void) { return t_message.c_str(); }
int epx_last_error_rank(void) { return t_rank; }

const char* epx_status_string(epx_status status) {
  switch (status) {
    case EPX_SUCCESS:
      return "success";
    case EPX_ERROR_INVALID_ARGUMENT:
      return epx::to_string(ErrorKind::invalid_argument);
    case EPX_ERROR_CUDA:
      return epx::to_string(ErrorKind::cuda);
    case EPX_ERROR_NCCL:
      return epx::to_string(ErrorKind::nccl);
    case EPX_ERROR_TIMEOUT:
      return epx::to_string(ErrorKind::timeout);
    case EPX_ERROR_SYSTEM:
      return epx::to_string(ErrorKind::system);
    case EPX_ERROR_INTERNAL:
      return epx::to_string(ErrorKind::internal);
  }
  return "unknown status";
}

size_t epx_struct_size(const char* name) {
  if (name == nullptr) return 0;
  static const std::pair<const char*, std::size_t> kSizes[] = {
      {"epx_tensor", sizeof(epx_tensor)},
      {"epx_streams", sizeof(epx_streams)},
      {"epx_unique_id", sizeof(epx_unique_id)},
      {"epx_team_options", sizeof(epx_team_options)},
      {"epx_ht_options", sizeof(epx_ht_options)},
      {"epx_ht_layout", sizeof(epx_ht_layout)},
      {"epx_ht_dispatch_args", sizeof(epx_ht_dispatch_args)},
      {"epx_ht_dispatch_result", sizeof(epx_ht_dispatch_result)},
      {"epx_ht_dispatch_copies", sizeof(epx_ht_dispatch_copies)},
      {"epx_ht_combine_args", sizeof(epx_ht_combine_args)},
      {"epx_ht_combine_result", sizeof(epx_ht_combine_result)},
      {"epx_ll_options", sizeof(epx_ll_options)},
      {"epx_ll_output_bytes", sizeof(epx_ll_output_bytes)},
      {"epx_ll_range", sizeof(epx_ll_range)},
      {"epx_ll_scales_layout", sizeof(epx_ll_scales_layout)},
      {"epx_ll_dispatch_outputs", sizeof(epx_ll_dispatch_outputs)},
      {"epx_ll_handle", sizeof(epx_ll_handle)},
      {"epx_ll_dispatch_args", sizeof(epx_ll_dispatch_args)},
      {"epx_ll_dispatch_result", sizeof(epx_ll_dispatch_result)},
      {"epx_ll_combine_args", sizeof(epx_ll_combine_args)},
      {"epx_ll_combine_result", sizeof(epx_ll_combine_result)},
  };
  for (const auto& [known, size] : kSizes) {
    if (std::strcmp(known, name) == 0) return size;
  }
  return 0;
}

// ---- teams -------------------------------------------------------------------------------------------------

epx_status epx_team_make_unique_id(epx_unique_id* out) {
  return guarded([&] {
    const epx::UniqueId id = epx::Team::make_unique_id();
    std::memcpy(deref(out, "out").bytes, id.bytes.data(), id.bytes.size());
  });
}

epx_status epx_team_create_nccl(const epx_unique_id* id, int rank, int nranks, const epx_team_options* options,
                                epx_team** out) {
  return guarded([&] {
    deref(out, "out");
    epx::UniqueId uid;
    std::memcpy(uid.bytes.data(), deref(id, "id").bytes, uid.bytes.size());
    epx::TeamOptions team_options;
    if (options != nullptr) {
      const epx_team_options o = read_struct(options, "options", epx_team_options EPX_TEAM_OPTIONS_INIT);
      team_options.wait_timeout = std::chrono::milliseconds(o.wait_timeout_ms);
    }
    auto team = std::make_unique<epx_team>();
    team->team = epx::Team::create_nccl(uid, rank, nranks, team_options);
    *out = team.release();
  });
}

epx_status epx_team_destroy(epx_team* team) { return destroy(team); }

epx_status epx_team_rank(const epx_team* team, int* out) {
  return guarded([&] { deref(out, "out") = deref(team, "team").team->rank(); });
}

epx_status epx_team_size(const epx_team* team, int* out) {
  return guarded([&] { deref(out, "out") = deref(team, "team").team->size(); });
}

epx_status epx_team_device(const epx_team* team, int* out) {
  return guarded([&] { deref(out, "out") = deref(team, "team").team->device(); });
}

epx_status epx_team_check_device_errors(epx_team* team) {
  return guarded([&] { deref(team, "team").team->check_device_errors(); });
}

epx_status epx_team_failed(const epx_team* team, int* out) {
  return guarded([&] { deref(out, "out") = deref(team, "team").team->failed() ? 1 : 0; });
}

// ---- HT ----------------------------------------------------------------------------------------------------

epx_status epx_ht_required_bytes(const epx_ht_options* options, int num_ranks, size_t* out) {
  return guarded([&] {
    const epx_ht_options o = read_struct(options, "options", epx_ht_options EPX_HT_OPTIONS_INIT);
    size_t& bytes = deref(out, "out");  // checked before the options are
    bytes = epx::HtBuffer::required_bytes(to_ht_options(o), num_ranks);
  });
}

epx_status epx_ht_default_num_sms(int num_ranks, int* out) {
  return guarded([&] { deref(out, "out") = epx::default_ht_config(num_ranks).num_sms; });
}

epx_status epx_ht_buffer_create(epx_team* team, const epx_ht_options* options, epx_ht_buffer** out) {
  return guarded([&] {
    deref(out, "out");
    epx::Team& t = *deref(team, "team").team;
    const epx_ht_options o = read_struct(options, "options", epx_ht_options EPX_HT_OPTIONS_INIT);
    epx::HtConfig config = epx::default_ht_config(t.size());
    if (o.num_sms != 0) config.num_sms = o.num_sms;
    auto buffer = std::make_unique<epx_ht_buffer>();
    buffer->buffer = std::make_unique<epx::HtBuffer>(t, to_ht_options(o), config);
    *out = buffer.release();
  });
}

epx_status epx_ht_buffer_destroy(epx_ht_buffer* buffer) { return destroy(buffer); }

epx_status epx_ht_buffer_bytes(const epx_ht_buffer* buffer, size_t* out) { return buffer_bytes(buffer, out); }

epx_status epx_ht_get_num_sms(const epx_ht_buffer* buffer, int* out) { return get_num_sms(buffer, out); }

epx_status epx_ht_set_num_sms(epx_ht_buffer* buffer, int num_sms) { return set_num_sms(buffer, num_sms); }

epx_status epx_ht_handle_release(epx_ht_handle* handle) { return destroy(handle); }

epx_status epx_ht_get_layout(epx_ht_buffer* buffer, const epx_tensor* topk_idx, const epx_ht_layout* out,
                             const epx_streams* streams, cudaEvent_t* finished) {
  return guarded([&] {
    epx::HtBuffer& b = *deref(buffer, "buffer").buffer;
    const epx_ht_layout& o = deref(out, "out");
    const epx::Streams s = to_streams(streams);
    if (s.async) deref(finished, "finished");
    const cudaEvent_t event =
        b.get_layout(to_ref(deref(topk_idx, "topk_idx"), "topk_idx"),
                     epx::HtLayout{o.num_tokens_per_rank, o.num_tokens_per_expert, o.is_token_in_rank}, s);
    if (finished != nullptr) *finished = event;
  });
}

epx_status epx_ht_dispatch(epx_ht_buffer* buffer, const epx_ht_dispatch_args* args, const epx_streams* streams,
                           epx_ht_dispatch_result* result) {
  return guarded([&] {
    epx::HtBuffer& b = *deref(buffer, "buffer").buffer;
    const epx_ht_dispatch_args a = read_struct(args, "args", epx_ht_dispatch_args EPX_HT_DISPATCH_ARGS_INIT);
    const std::size_t result_size = output_size(result, "result");
    // [in] field of the result, read only where the caller's struct has it.
    constexpr std::size_t kHostCountsEnd =
        offsetof(epx_ht_dispatch_result, num_recv_tokens_per_expert_host) + sizeof(int32_t*);
    int32_t* host_counts = result_size >= kHostCountsEnd ? result->num_recv_tokens_per_expert_host : nullptr;
    epx::HtDispatchArgs d;
    d.x = to_ref(a.x, "x");
    d.x_scales = to_ref(a.x_scales, "x_scales");
    d.topk_idx = to_ref(a.topk_idx, "topk_idx");
    d.topk_weights = to_ref(a.topk_weights, "topk_weights");
    d.expert_alignment = a.expert_alignment;
    d.num_worst_tokens = a.num_worst_tokens;
    if (a.cached != nullptr) d.cached = a.cached->handle;
    epx::HtDispatchResult r = b.dispatch(d, to_streams(streams));

    epx_ht_dispatch_result out{};
    out.num_rows = r.num_rows;
    out.num_recv_tokens = r.num_recv_tokens;
    out.recv_x = from_ref(r.recv_x);
    out.recv_x_scales = from_ref(r.recv_x_scales);
    out.recv_src_idx = from_ref(r.recv_src_idx);
    out.recv_topk_idx = from_ref(r.recv_topk_idx);
    out.recv_topk_weights = from_ref(r.recv_topk_weights);
    out.num_recv_tokens_per_expert = from_ref(r.num_recv_tokens_per_expert);
    out.num_recv_tokens_per_expert_host = host_counts;
    if (host_counts != nullptr && !r.num_recv_tokens_per_expert_host.empty()) {
      std::copy(r.num_recv_tokens_per_expert_host.begin(), r.num_recv_tokens_per_expert_host.end(), host_counts);
      out.num_recv_tokens_per_expert_host_valid = 1;
    }
    out.handle = new epx_ht_handle{std::move(r.handle)};
    out.finished = r.finished;
    out.count_matrix = from_ref(r.count_matrix);
    write_struct(result, result_size, out);
  });
}

epx_status epx_ht_copy_dispatch_outputs(epx_ht_buffer* buffer, const epx_ht_dispatch_copies* to,
                                        const epx_streams* streams, cudaEvent_t* finished) {
  return guarded([&] {
    epx::HtBuffer& b = *deref(buffer, "buffer").buffer;
    const epx_ht_dispatch_copies t = read_struct(to, "to", epx_ht_dispatch_copies EPX_HT_DISPATCH_COPIES_INIT);
    const epx::Streams s = to_streams(streams);
    if (s.async) deref(finished, "finished");
    const epx::HtDispatchCopies copies{to_ref(t.recv_x, "recv_x"),
                                       to_ref(t.recv_x_scales, "recv_x_scales"),
                                       to_ref(t.recv_src_idx, "recv_src_idx"),
                                       to_ref(t.recv_topk_idx, "recv_topk_idx"),
                                       to_ref(t.recv_topk_weights, "recv_topk_weights"),
                                       to_ref(t.num_recv_tokens_per_expert, "num_recv_tokens_per_expert")};
    const cudaEvent_t event = b.copy_dispatch_outputs(copies, s);
    if (finished != nullptr) *finished = event;
  });
}

epx_status epx_ht_combine(epx_ht_buffer* buffer, const epx_ht_combine_args* args, const epx_streams* streams,
                          epx_ht_combine_result* result) {
  return guarded([&] {
    epx::HtBuffer& b = *deref(buffer, "buffer").buffer;
    const epx_ht_combine_args a = read_struct(args, "args", epx_ht_combine_args EPX_HT_COMBINE_ARGS_INIT);
    const std::size_t result_size = output_size(result, "result");
    epx::HtCombineArgs c;
    c.y = to_ref(a.y, "y");
    c.topk_weights = to_ref(a.topk_weights, "topk_weights");
    c.bias = to_ref(a.bias, "bias");
    if (a.handle != nullptr) c.handle = a.handle->handle;  // a missing handle is the C++ layer's to report
    c.out = to_ref(a.out, "out");
    c.out_weights = to_ref(a.out_weights, "out_weights");
    c.second_bias = to_ref(a.second_bias, "second_bias");
    const epx::HtCombineResult r = b.combine(c, to_streams(streams));
    epx_ht_combine_result out{};
    out.x = from_ref(r.x);
    out.topk_weights = from_ref(r.topk_weights);
    out.finished = r.finished;
    write_struct(result, result_size, out);
  });
}

epx_status epx_ht_combine_input(const epx_ht_buffer* buffer, int64_t rows, int64_t hidden, epx_tensor* out) {
  return guarded([&] { deref(out, "out") = from_ref(deref(buffer, "buffer").buffer->combine_input(rows, hidden)); });
}

epx_status epx_ht_combine_input_weights(const epx_ht_buffer* buffer, int64_t rows, int64_t topk, epx_tensor* out) {
  return guarded(
      [&] { deref(out, "out") = from_ref(deref(buffer, "buffer").buffer->combine_input_weights(rows, topk)); });
}

epx_status epx_ht_check_errors(epx_ht_buffer* buffer) { return check_errors(buffer); }

// ---- LL ----------------------------------------------------------------------------------------------------

epx_status epx_ll_required_bytes(const epx_ll_options* options, int num_ranks, size_t* out) {
  return guarded([&] {
    const epx_ll_options o = read_struct(options, "options", epx_ll_options EPX_LL_OPTIONS_INIT);
    size_t& bytes = deref(out, "out");  // checked before the options are
    bytes = epx::LlBuffer::required_bytes(to_ll_options(o), num_ranks);
  });
}

epx_status epx_ll_buffer_create(epx_team* team, const epx_ll_options* options, epx_ll_buffer** out) {
  return guarded([&] {
    deref(out, "out");
    epx::Team& t = *deref(team, "team").team;
    const epx_ll_options o = read_struct(options, "options", epx_ll_options EPX_LL_OPTIONS_INIT);
    auto buffer = std::make_unique<epx_ll_buffer>();
    buffer->buffer = std::make_unique<epx::LlBuffer>(t, to_ll_options(o), epx::LlConfig{o.num_sms});
    *out = buffer.release();
  });
}

epx_status epx_ll_buffer_destroy(epx_ll_buffer* buffer) { return destroy(buffer); }

epx_status epx_ll_buffer_bytes(const epx_ll_buffer* buffer, size_t* out) { return buffer_bytes(buffer, out); }

epx_status epx_ll_get_num_sms(const epx_ll_buffer* buffer, int* out) { return get_num_sms(buffer, out); }

epx_status epx_ll_set_num_sms(epx_ll_buffer* buffer, int num_sms) { return set_num_sms(buffer, num_sms); }

epx_status epx_ll_output_sizes(const epx_ll_buffer* buffer, int use_fp8, int use_ue8m0, int hidden,
                               epx_ll_output_bytes* out) {
  return guarded([&] {
    const std::size_t size = output_size(out, "out");
    const epx::LlBuffer::OutputBytes b =
        deref(buffer, "buffer").buffer->output_bytes(use_fp8 != 0, use_ue8m0 != 0, hidden);
    write_struct(out, size, epx_ll_output_bytes{0, b.x, b.scales, b.recv_count, b.src_idx, b.layout_range});
  });
}

epx_status epx_ll_dispatch(epx_ll_buffer* buffer, const epx_ll_dispatch_args* args, const epx_streams* streams,
                           epx_ll_dispatch_result* result) {
  return guarded([&] {
    epx::LlBuffer& b = *deref(buffer, "buffer").buffer;
    const epx_ll_dispatch_args a = read_struct(args, "args", epx_ll_dispatch_args EPX_LL_DISPATCH_ARGS_INIT);
    const std::size_t result_size = output_size(result, "result");
    epx::LlDispatchArgs d;
    d.x = to_ref(a.x, "x");
    d.topk_idx = to_ref(a.topk_idx, "topk_idx");
    d.topk_weights = to_ref(a.topk_weights, "topk_weights");
    d.use_fp8 = a.use_fp8 != 0;
    d.round_scale = a.round_scale != 0;
    d.use_ue8m0 = a.use_ue8m0 != 0;
    d.out.x = a.out.x;
    d.out.scales = a.out.scales;
    d.out.scales_layout = {a.out.scales_layout.expert_stride, a.out.scales_layout.row_stride,
                           a.out.scales_layout.col_stride};
    d.out.recv_count = a.out.recv_count;
    d.out.src_idx = a.out.src_idx;
    d.out.layout_range = reinterpret_cast<epx::LlRange*>(a.out.layout_range);
    d.cumulative_recv_count = a.cumulative_recv_count;
    d.cumulative_wait_cycles = a.cumulative_wait_cycles;
    d.send_only = a.send_only != 0;
    epx::LlDispatchResult r = b.dispatch(d, to_streams(streams));
    epx_ll_dispatch_result out{};
    out.handle = from_ll_handle(r.handle);
    out.finished = r.finished;
    out.receive = wrap_receive(std::move(r.receive));
    write_struct(result, result_size, out);
  });
}

epx_status epx_ll_combine(epx_ll_buffer* buffer, const epx_ll_combine_args* args, const epx_streams* streams,
                          epx_ll_combine_result* result) {
  return guarded([&] {
    epx::LlBuffer& b = *deref(buffer, "buffer").buffer;
    const epx_ll_combine_args a = read_struct(args, "args", epx_ll_combine_args EPX_LL_COMBINE_ARGS_INIT);
    const std::size_t result_size = output_size(result, "result");
    if (a.order != EPX_LL_COMBINE_LOCAL && a.order != EPX_LL_COMBINE_NAIVE) {
      fail("order must be EPX_LL_COMBINE_LOCAL or EPX_LL_COMBINE_NAIVE, got " + std::to_string(a.order));
    }
    epx::LlCombineArgs c;
    c.y = to_ref(a.y, "y");
    c.topk_weights = to_ref(a.topk_weights, "topk_weights");
    c.handle = to_ll_handle(a.handle);
    c.order = a.order == EPX_LL_COMBINE_NAIVE ? epx::LlCombineOrder::naive : epx::LlCombineOrder::local;
    c.out = to_ref(a.out, "out");
    c.send_only = a.send_only != 0;
    c.cumulative_wait_cycles = a.cumulative_wait_cycles;
    epx::LlCombineResult r = b.combine(c, to_streams(streams));
    epx_ll_combine_result out{};
    out.finished = r.finished;
    out.receive = wrap_receive(std::move(r.receive));
    write_struct(result, result_size, out);
  });
}

epx_status epx_ll_receive_run(epx_ll_receive* receive) {
  return guarded([&] { deref(receive, "receive").step(); });
}

epx_status epx_ll_receive_release(epx_ll_receive* receive) { return destroy(receive); }

epx_status epx_ll_combine_buffer(epx_ll_buffer* buffer, epx_tensor* out) {
  return guarded([&] { deref(out, "out") = from_ref(deref(buffer, "buffer").buffer->combine_buffer()); });
}

epx_status epx_ll_check_errors(epx_ll_buffer* buffer) { return check_errors(buffer); }

epx_status epx_ll_set_rank_masked(epx_ll_buffer* buffer, int rank, int masked, cudaStream_t stream) {
  return guarded([&] { deref(buffer, "buffer").buffer->set_rank_masked(rank, masked != 0, stream); });
}

epx_status epx_ll_query_rank_mask(epx_ll_buffer* buffer, int32_t* out, cudaStream_t stream) {
  return guarded([&] { deref(buffer, "buffer").buffer->query_rank_mask(out, stream); });
}

epx_status epx_ll_clear_rank_mask(epx_ll_buffer* buffer, cudaStream_t stream) {
  return guarded([&] { deref(buffer, "buffer").buffer->clear_rank_mask(stream); });
}

}  // extern "C"
