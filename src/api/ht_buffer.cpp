// HtBuffer: argument checks, the order of the HT kernels, and the host side of the exact form.
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>

#include "api/call_order.hpp"
#include "api/ht_handle.hpp"
#include "core/cuda_check.hpp"
#include "core/ht_areas.hpp"
#include "core/validate.hpp"
#include "epx/ht.hpp"
#include "kernels/ht/launch.hpp"
#include "transport/team_impl.hpp"

namespace epx {

using detail::check_cuda;
namespace kh = kernels::ht;

// From the num_sms sweeps (8, 12, 16, 20, 24, 32 SMs; "ht_tuning" in bench/results/), within the issue's
// budget of 16 SMs:
// - EP=2 (nvidia-h200-x2.json, b98a7d4): dispatch BF16 and FP8 gain nothing past 16 (BF16 310.5, 213.6,
//   179.8, 179.9, 181.1, 180.4 us); the combine is fastest at 16 (203.2, then 214.6, 233.2, 237.6 at 20 to
//   32) and the zero-copy combine within 0.2 us of its best there (193.5; 193.3 at 24).
// - EP=4 (nvidia-h200-x4.json, 86c8fef): dispatch is within 1.2% from 12 to 32 (BF16 477.1 at 12, 482.6 at 16,
//   494.4 at 32 us); the combine is fastest at 16 (529.4; 542.8 at 12, 542.6 at 24) and so is the
//   zero-copy combine (510.8).
// - EP=8 (nvidia-h200-x8.json, 92475b3): dispatch BF16 is fastest at 8 (875, 1001, 946, 947, 926, 888 us)
//   and FP8 nearly so (518 at 8, 510 at 32, 540 at 16); the combine is 3% slower at 8 than at 16 (1060
//   against 1026 us). Dispatch and combine together take 1935 us at 8 SMs, 1972 at 16 and 1933 at 32,
//   so 8 ranks and more get 8 SMs: the same time, and more SMs left to the caller's compute.
// Callers that can spare SMs raise it with set_config.
HtConfig default_ht_config(int num_ranks) {
  HtConfig config;
  config.num_sms = num_ranks >= 8 ? 8 : 16;
  return config;
}

struct HtBuffer::Impl {
  Team& team;
  HtBufferOptions options;
  HtConfig config;
  core::HtAreas areas;
  SymmetricMemory memory;
  api::CallOrder calls;
  kh::HostMailbox* mailbox = nullptr;  // host-mapped
  kh::HostMailbox* mailbox_device = nullptr;
  uint32_t next_ticket = 0;
  // Private words of the kernels, zero at creation (see dispatch.cu and combine.cu); the layout
  // kernel's scratch follows them in the same allocation.
  struct alignas(16) Counters {
    uint32_t dispatch_blocks_done;
    uint32_t dispatch_tokens_claimed;
    uint32_t combine_blocks_done;
    uint32_t combine_tokens_claimed;
  };
  static_assert(sizeof(Counters) % 16 == 0, "the layout scratch follows the counters, 16-byte aligned");
  Counters* counters = nullptr;
  kh::LayoutScratch layout_scratch{};
  uint16_t* combine_out = nullptr;       // [T_max][H] with options.combine_output, else null
  float* combine_out_weights = nullptr;  // [T_max][K_max]
  std::size_t private_bytes = 0;
  std::shared_ptr<HtHandlePool> handles;
  int sm_count = 0;
  // The views the latest dispatch returned (what copy_dispatch_outputs copies); none before the first.
  std::optional<HtDispatchCopies> latest_outputs;

  Impl(Team& t, const HtBufferOptions& o, const HtConfig& c) : team(t), options(o), config(c), calls(t) {}
  ~Impl();

  kh::BufferView make_view() const;
  kh::BufferView view{};  // what the kernels see of this buffer: fixed once the buffer exists
  void report_recorded_errors();
  void wait_for_ticket(uint32_t ticket, cudaStream_t stream);
  kh::LayoutArgs layout_args(const TensorRef& topk_idx, const kh::LayoutOutputs& outputs) const;
  void validate_config(const HtConfig& c) const;
};

HtBuffer::Impl::~Impl() {
  // Handles the caller still holds keep the pool (and their blocks) alive; this buffer's part ends here.
  if (mailbox != nullptr) cudaFreeHost(mailbox);
  cudaFree(counters);
  cudaFree(combine_out);
  cudaFree(combine_out_weights);
}

kh::BufferView HtBuffer::Impl::make_view() const {
  kh::BufferView v{};
  v.team = team.impl().view();
  v.base = team.impl().symmetric_view(memory);
  v.notify_counts = areas.notify_counts;
  v.notify_expert_counts = areas.notify_expert_counts;
  v.done_words = areas.done_words;
  v.combine_progress = areas.combine_progress;
  v.sequence = areas.sequence;
  v.recv_x = areas.recv_x;
  v.recv_scales = areas.recv_scales;
  v.recv_src_idx = areas.recv_src_idx;
  v.recv_topk_idx = areas.recv_topk_idx;
  v.recv_topk_weights = areas.recv_topk_weights;
  v.combine_input = areas.combine_input;
  v.combine_input_weights = areas.combine_input_weights;
  v.num_experts = options.num_experts;
  return v;
}

kh::LayoutArgs HtBuffer::Impl::layout_args(const TensorRef& topk_idx, const kh::LayoutOutputs& outputs) const {
  kh::LayoutArgs a{};
  a.topk_idx = topk_idx.data;
  a.topk_int64 = topk_idx.type == ScalarType::int64;
  a.topk_row_stride = topk_idx.row_stride;
  a.num_tokens = int32_t(topk_idx.rows);
  a.topk = int32_t(topk_idx.cols);
  a.num_ranks = team.size();
  a.num_experts = options.num_experts;
  a.out = outputs;
  a.scratch = layout_scratch;
  return a;
}

void HtBuffer::Impl::validate_config(const HtConfig& c) const {
  core::check_num_sms("HtConfig::num_sms", c.num_sms, team.size(), team.is_single_gpu(), sm_count);
}

// Errors that kernels recorded without the host waiting for them (HostMailbox's sticky fields).
// Reported where every rank is at the same point (the end of an exact-form dispatch), or where the
// caller asks (check_errors), never at the start of a collective call: one rank throwing there would
// leave the others waiting for it.
void HtBuffer::Impl::report_recorded_errors() {
  volatile kh::HostMailbox* m = mailbox;
  if (m->layout_input.found) {
    const kh::InputError input{m->layout_input.found, m->layout_input.token, m->layout_input.slot,
                               m->layout_input.value};
    m->layout_input.found = 0;
    detail::fail(ErrorKind::invalid_argument, "HT get_layout: topk_idx[" + std::to_string(input.token) + "][" +
                                                  std::to_string(input.slot) + "] = " + std::to_string(input.value) +
                                                  " is not an expert id in [-1, " +
                                                  std::to_string(options.num_experts) + ")");
  }
  if (m->failed_rank >= 0) {
    const int failed = m->failed_rank;
    const kh::InputError input{m->input.found, m->input.token, m->input.slot, m->input.value};
    m->failed_rank = -1;
    m->input.found = 0;
    if (failed == team.rank() && input.found) {
      detail::fail(ErrorKind::invalid_argument,
                   "HT dispatch: topk_idx[" + std::to_string(input.token) + "][" + std::to_string(input.slot) +
                       "] = " + std::to_string(input.value) + " is not an expert id in [-1, " +
                       std::to_string(options.num_experts) + "); the dispatch sent nothing on any rank");
    }
    detail::fail(ErrorKind::invalid_argument,
                 "HT dispatch: rank " + std::to_string(failed) +
                     " passed an invalid input (an expert id out of range, or more tokens than max_tokens_per_rank); "
                     "the dispatch sent nothing on any rank");
  }
  if (m->overflow != 0) {
    const int n = m->overflow;
    m->overflow = 0;
    detail::fail(ErrorKind::invalid_argument,
                 "HT dispatch (worst-case form): " + std::to_string(n) +
                     " rows arrived but num_worst_tokens was smaller; rows past it were "
                     "not returned: raise num_worst_tokens (at most R * max_tokens_per_rank)");
  }
}

// The exact form's host wait: bounded by the team's timeout, and it gives up early when the stream
// reports an error or a device wait of the team has expired. The ready word is polled on every spin; the
// stream, the clock and the team's errors only every kCheckPeriod: cudaStreamQuery takes the driver's
// locks, and ranks of a single-GPU team querying on every spin kept other ranks' threads from launching
// their kernels (2026-11-22: 33 ranks on one GPU, first dispatches not started within the 5 s timeout).
void HtBuffer::Impl::wait_for_ticket(uint32_t ticket, cudaStream_t stream) {
  constexpr auto kCheckPeriod = std::chrono::microseconds(200);
  const auto start = std::chrono::steady_clock::now();
  auto next_check = start + kCheckPeriod;
  volatile uint32_t* ready = &mailbox->ready;
  while (*ready != ticket) {
    const auto now = std::chrono::steady_clock::now();
    if (now < next_check) {
      std::this_thread::yield();
      continue;
    }
    next_check = now + kCheckPeriod;
    const cudaError_t status = cudaStreamQuery(stream);
    if (status != cudaSuccess && status != cudaErrorNotReady) check_cuda(status, "HT dispatch kernels");
    if (status == cudaSuccess && *ready != ticket) {
      team.check_device_errors();
      detail::fail(ErrorKind::internal, "HT dispatch: the kernels finished but did not report the received count");
    }
    // Twice the device's bound: a device wait that expires reports who it waited for, which says more.
    if (now - start > 2 * team.options().wait_timeout) {
      team.check_device_errors();
      team.impl().mark_failed();
      detail::fail(ErrorKind::timeout,
                   "HT dispatch: the received count did not arrive within twice the team's timeout");
    }
  }
  std::atomic_thread_fence(std::memory_order_acquire);
}

namespace {

// The options no HT buffer can have (the constructor and required_bytes).
void check_options(const HtBufferOptions& options, int R) {
  EPX_REQUIRE(R >= 1 && R <= kMaxNvlinkRanks,
              "an HT buffer needs 1 to " + std::to_string(kMaxNvlinkRanks) + " ranks, got " + std::to_string(R));
  EPX_REQUIRE(options.max_tokens_per_rank >= 1, "HtBufferOptions::max_tokens_per_rank must be >= 1");
  EPX_REQUIRE(options.hidden >= 128 && options.hidden % 128 == 0 && options.hidden <= kh::kMaxHidden,
              "HtBufferOptions::hidden must be a positive multiple of 128 up to " + std::to_string(kh::kMaxHidden) +
                  ", got " + std::to_string(options.hidden));
  EPX_REQUIRE(options.handle_blocks >= 1, "HtBufferOptions::handle_blocks must be >= 1");
  EPX_REQUIRE(options.max_topk >= 1 && options.max_topk <= kh::kMaxLayoutTopk,
              "HtBufferOptions::max_topk must be in [1, " + std::to_string(kh::kMaxLayoutTopk) + "], got " +
                  std::to_string(options.max_topk));
  EPX_REQUIRE(options.num_experts >= R && options.num_experts % R == 0,
              "HtBufferOptions::num_experts (" + std::to_string(options.num_experts) +
                  ") must be a positive multiple of the team size (" + std::to_string(R) + ")");
  EPX_REQUIRE(int64_t(R) * options.max_tokens_per_rank < (int64_t(1) << 31),
              "R * max_tokens_per_rank must fit in int32");
  EPX_REQUIRE(options.num_experts <= kh::kMaxLayoutExperts, "HtBufferOptions::num_experts is at most " +
                                                                std::to_string(kh::kMaxLayoutExperts) + ", got " +
                                                                std::to_string(options.num_experts));
}

// Device memory private to one rank: the kernels' zeroed words (Impl::Counters, then the layout
// kernel's scratch), and the combine outputs (the rows' only with options.combine_output).
struct PrivateBytes {
  std::size_t zeroed, combine_out, combine_out_weights;
  std::size_t total() const { return zeroed + combine_out + combine_out_weights; }
};

PrivateBytes private_bytes(const HtBufferOptions& options, int R) {
  const std::size_t T = options.max_tokens_per_rank;
  return PrivateBytes{
      sizeof(HtBuffer::Impl::Counters) + kh::layout_scratch_bytes(options.max_tokens_per_rank, R, options.num_experts),
      options.combine_output ? T * options.hidden * 2 : 0, T * options.max_topk * sizeof(float)};
}

}  // namespace

HtBuffer::HtBuffer(Team& team, const HtBufferOptions& options, const HtConfig& config)
    : impl_(std::make_unique<Impl>(team, options, config)) {
  detail::ScopedRank scoped(team.rank());
  const int R = team.size();
  check_options(options, R);
  check_cuda(cudaDeviceGetAttribute(&impl_->sm_count, cudaDevAttrMultiProcessorCount, team.device()),
             "cudaDeviceGetAttribute");
  impl_->validate_config(config);
  kh::prepare_kernels();
  impl_->areas = core::ht_areas(options, R);
  impl_->memory = team.allocate_symmetric(impl_->areas.total);
  const int E_local = options.num_experts / R;
  const std::size_t mailbox_bytes = sizeof(kh::HostMailbox) + sizeof(int32_t) * E_local;
  void* mailbox = nullptr;
  check_cuda(cudaHostAlloc(&mailbox, mailbox_bytes, cudaHostAllocMapped), "cudaHostAlloc(HT mailbox)");
  std::memset(mailbox, 0, mailbox_bytes);
  impl_->mailbox = static_cast<kh::HostMailbox*>(mailbox);
  impl_->mailbox->failed_rank = -1;
  check_cuda(cudaHostGetDevicePointer(reinterpret_cast<void**>(&impl_->mailbox_device), mailbox, 0),
             "cudaHostGetDevicePointer");
  const PrivateBytes sizes = private_bytes(options, R);
  check_cuda(cudaMalloc(reinterpret_cast<void**>(&impl_->counters), sizes.zeroed), "cudaMalloc(HT counters)");
  // On the buffer's stream, waited for below (the handle pool's): a plain cudaMemset runs on the legacy
  // stream, which kernels on non-blocking streams do not wait for.
  check_cuda(cudaMemsetAsync(impl_->counters, 0, sizes.zeroed, impl_->calls.comm_stream()),
             "cudaMemsetAsync(HT CTA counters)");
  impl_->layout_scratch =
      kh::layout_scratch(impl_->counters + 1, options.max_tokens_per_rank, R, options.num_experts, team.impl().view());
  if (sizes.combine_out > 0) {
    check_cuda(cudaMalloc(reinterpret_cast<void**>(&impl_->combine_out), sizes.combine_out),
               "cudaMalloc(HT combine output)");
  }
  check_cuda(cudaMalloc(reinterpret_cast<void**>(&impl_->combine_out_weights), sizes.combine_out_weights),
             "cudaMalloc(HT combine weights)");
  impl_->private_bytes = sizes.total();
  impl_->handles = std::make_shared<HtHandlePool>(R, options.max_tokens_per_rank, options.num_experts,
                                                  options.handle_blocks, impl_->calls.comm_stream());
  impl_->view = impl_->make_view();
}

HtBuffer::~HtBuffer() = default;

const HtConfig& HtBuffer::config() const { return impl_->config; }

void HtBuffer::set_config(const HtConfig& config) {
  detail::ScopedRank scoped(impl_->team.rank());
  impl_->validate_config(config);
  impl_->config = config;
}

std::size_t HtBuffer::buffer_bytes() const {
  return impl_->areas.total + impl_->private_bytes + impl_->handles->bytes();
}

TensorRef HtBuffer::combine_input(int64_t rows, int64_t hidden) const {
  detail::ScopedRank scoped(impl_->team.rank());
  EPX_REQUIRE(rows >= 0 && rows <= impl_->areas.recv_rows && hidden >= 128 && hidden % 128 == 0 &&
                  hidden <= impl_->options.hidden,
              "combine_input(" + std::to_string(rows) + ", " + std::to_string(hidden) + "): at most " +
                  std::to_string(impl_->areas.recv_rows) +
                  " rows of a hidden size that is a multiple of 128, at most " + std::to_string(impl_->options.hidden));
  char* base = static_cast<char*>(impl_->memory.local());
  return TensorRef::matrix(base + impl_->areas.combine_input, ScalarType::bf16, rows, hidden);
}

TensorRef HtBuffer::combine_input_weights(int64_t rows, int64_t topk) const {
  detail::ScopedRank scoped(impl_->team.rank());
  EPX_REQUIRE(rows >= 0 && rows <= impl_->areas.recv_rows && topk >= 1 && topk <= impl_->options.max_topk,
              "combine_input_weights(" + std::to_string(rows) + ", " + std::to_string(topk) + ") is out of range");
  char* base = static_cast<char*>(impl_->memory.local());
  return TensorRef::matrix(base + impl_->areas.combine_input_weights, ScalarType::float32, rows, topk);
}

std::size_t HtBuffer::required_bytes(const HtBufferOptions& options, int num_ranks) {
  check_options(options, num_ranks);
  return core::ht_areas(options, num_ranks).total + private_bytes(options, num_ranks).total();
}

void HtBuffer::check_errors() {
  detail::ScopedRank scoped(impl_->team.rank());
  impl_->team.check_device_errors();
  impl_->report_recorded_errors();
}

cudaEvent_t HtBuffer::get_layout(const TensorRef& topk_idx, const HtLayout& out, const HtStreams& streams) {
  Impl& im = *impl_;
  detail::ScopedRank scoped(im.team.rank());
  im.report_recorded_errors();  // local call: nobody waits for this rank
  core::check_tensor(topk_idx, {"topk_idx", {ScalarType::int64, ScalarType::int32}});
  EPX_REQUIRE(topk_idx.rows <= im.options.max_tokens_per_rank,
              "topk_idx has " + std::to_string(topk_idx.rows) +
                  " tokens, more than the buffer's max_tokens_per_rank (" +
                  std::to_string(im.options.max_tokens_per_rank) + ")");
  EPX_REQUIRE(topk_idx.cols >= 1 && topk_idx.cols <= im.options.max_topk,
              "topk_idx has " + std::to_string(topk_idx.cols) + " columns; the buffer allows 1 to " +
                  std::to_string(im.options.max_topk));
  EPX_REQUIRE(out.num_tokens_per_rank != nullptr && out.num_tokens_per_expert != nullptr,
              "get_layout: num_tokens_per_rank and num_tokens_per_expert are required outputs");
  EPX_REQUIRE(topk_idx.rows == 0 || out.is_token_in_rank != nullptr,
              "get_layout: is_token_in_rank is a required output");
  const cudaStream_t stream = im.calls.begin(streams, "HT");
  kh::LayoutOutputs outputs;
  outputs.rank_counts = out.num_tokens_per_rank;
  outputs.expert_token_counts = out.num_tokens_per_expert;
  outputs.is_token_in_rank = out.is_token_in_rank;
  outputs.error = &im.mailbox_device->layout_input;
  kh::launch_layout(im.layout_args(topk_idx, outputs), stream);
  return im.calls.end(streams, stream);
}

HtDispatchResult HtBuffer::dispatch(const HtDispatchArgs& args, const HtStreams& streams) {
  Impl& im = *impl_;
  detail::ScopedRank scoped(im.team.rank());
  im.latest_outputs.reset();  // a dispatch that throws leaves nothing to copy

  const int R = im.team.size();
  const int64_t T = args.topk_idx.rows;
  const int64_t H = args.x.cols;
  const bool fp8 = args.x.type == ScalarType::fp8_e4m3;
  // T is the one argument that differs between ranks by nature: a rank with too many tokens still takes
  // part, with none, and tells the others through its status word, so that every rank fails this
  // dispatch with an error (and none waits for it until the team's timeout). Not inside a graph capture,
  // where nothing runs: there it throws at once.
  const auto too_many = [&] {  // built only when needed: this is every dispatch's path
    return "HT dispatch of " + std::to_string(T) + " tokens, more than the buffer's max_tokens_per_rank (" +
           std::to_string(im.options.max_tokens_per_rank) + ")";
  };
  const bool refused = T > im.options.max_tokens_per_rank;
  if (refused) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    check_cuda(cudaStreamIsCapturing(streams.stream, &capture), "cudaStreamIsCapturing");
    EPX_REQUIRE(!args.cached && capture == cudaStreamCaptureStatusNone, too_many());
  }
  core::check_tensor(args.x, {"x", {ScalarType::bf16, ScalarType::fp8_e4m3}, T, -1, true, 16});
  EPX_REQUIRE(H >= 128 && H % 128 == 0 && H <= im.options.hidden,
              "x has hidden " + std::to_string(H) + ": it must be a positive multiple of 128, at most the buffer's " +
                  std::to_string(im.options.hidden));
  core::check_tensor(args.topk_idx, {"topk_idx", {ScalarType::int64, ScalarType::int32}});
  const int64_t K = args.topk_idx.cols;
  EPX_REQUIRE(
      K >= 1 && K <= im.options.max_topk,
      "topk_idx has " + std::to_string(K) + " columns; the buffer allows 1 to " + std::to_string(im.options.max_topk));
  core::check_optional_tensor(args.topk_weights, {"topk_weights", {ScalarType::float32}, T, K});
  if (fp8) {
    core::check_tensor(args.x_scales, {"x_scales", {ScalarType::float32}, T, H / 128, false});
  } else {
    EPX_REQUIRE(args.x_scales.empty(), "x_scales is given but x is bf16 (scales go with fp8_e4m3 x only)");
  }
  EPX_REQUIRE(args.expert_alignment >= 1 && args.expert_alignment <= (1 << 16),
              "expert_alignment must be in [1, 65536], got " + std::to_string(args.expert_alignment));
  const int64_t capacity = im.areas.recv_rows;
  EPX_REQUIRE(args.num_worst_tokens >= 0 && args.num_worst_tokens <= capacity,
              "num_worst_tokens must be in [0, R * max_tokens_per_rank = " + std::to_string(capacity) + "], got " +
                  std::to_string(args.num_worst_tokens));
  if (args.cached) {
    EPX_REQUIRE(args.cached->pool() == im.handles.get(), "the cached handle comes from another HtBuffer");
    EPX_REQUIRE(args.cached->num_tokens == T && args.cached->topk == K,
                "the cached handle was made for " + std::to_string(args.cached->num_tokens) + " tokens of top-" +
                    std::to_string(args.cached->topk) + ", not " + std::to_string(T) + " of top-" + std::to_string(K));
    EPX_REQUIRE(args.cached->expert_alignment == args.expert_alignment,
                "a cached dispatch keeps its handle's expert_alignment (" +
                    std::to_string(args.cached->expert_alignment) + "), got " + std::to_string(args.expert_alignment));
  }

  const cudaStream_t stream = im.calls.begin(streams, "HT");
  const int64_t sent = refused ? 0 : T;  // the tokens this rank sends
  std::shared_ptr<HtHandle> fresh;
  const HtHandle* handle = args.cached.get();
  if (handle == nullptr) {
    fresh =
        std::make_shared<HtHandle>(im.handles, im.handles->acquire(stream), int(sent), int(K), args.expert_alignment);
    handle = fresh.get();
    kh::LayoutOutputs outputs;
    outputs.send_pos = handle->view().send_pos;
    outputs.rank_counts = handle->view().rank_counts;
    outputs.expert_token_counts = handle->view().expert_totals;
    outputs.error = handle->view().input_error;
    TensorRef routed = args.topk_idx;
    routed.rows = sent;
    kh::launch_layout(im.layout_args(routed, outputs), stream);
  }
  const kh::BufferView& view = im.view;
  const uint32_t ticket = ++im.next_ticket;
  kh::TokensView tokens{};
  tokens.x = static_cast<const uint8_t*>(args.x.data);
  tokens.x_row_bytes_stride = args.x.row_stride * element_size(args.x.type);
  tokens.x_row_bytes = int32_t(H * element_size(args.x.type));
  tokens.hidden = int32_t(H);
  tokens.scales = fp8 ? static_cast<const float*>(args.x_scales.data) : nullptr;
  tokens.scale_row_stride = args.x_scales.row_stride;
  tokens.scale_col_stride = args.x_scales.col_stride;
  tokens.topk_idx = args.topk_idx.data;
  tokens.topk_int64 = args.topk_idx.type == ScalarType::int64;
  tokens.topk_row_stride = args.topk_idx.row_stride;
  tokens.weights = static_cast<const float*>(args.topk_weights.data);
  tokens.weights_row_stride = args.topk_weights.row_stride;
  tokens.num_tokens = int32_t(sent);
  tokens.topk = int32_t(K);
  kh::CountExchangeArgs counts{};
  counts.mailbox = im.mailbox_device;
  counts.ticket = ticket;
  counts.expert_alignment = args.expert_alignment;
  counts.num_worst_tokens = args.num_worst_tokens;
  counts.cached = handle != fresh.get();
  counts.refused = refused;
  kh::launch_dispatch(kh::DispatchArgs{view, handle->view(), tokens, counts, &im.counters->dispatch_blocks_done,
                                       &im.counters->dispatch_tokens_claimed},
                      im.config.num_sms, handle == fresh.get(), stream);
  handle->mark_use(stream);
  if (refused) {  // the others learn it from the status word; this rank reports its own cause
    im.wait_for_ticket(ticket, stream);
    im.calls.end(HtStreams{streams.stream}, stream);  // ordered as a call; no `finished` event to hand out
    im.mailbox->failed_rank = -1;
    detail::fail(ErrorKind::invalid_argument, too_many() + "; the dispatch sent nothing on any rank");
  }

  HtDispatchResult result;
  if (args.num_worst_tokens == 0) {
    // A cached dispatch of an exact-form one has the same routing, so the same N and per-expert rows, which
    // the host has from that dispatch: no wait for the kernel's count.
    const bool known = handle->num_recv_tokens >= 0;
    if (!known) im.wait_for_ticket(ticket, stream);
    im.report_recorded_errors();
    result.num_recv_tokens = known ? handle->num_recv_tokens : im.mailbox->num_recv;
    result.num_rows = result.num_recv_tokens;
    if (known) {
      result.num_recv_tokens_per_expert_host = handle->num_recv_tokens_per_expert_host;
    } else {
      result.num_recv_tokens_per_expert_host.assign(im.mailbox->expert_counts,
                                                    im.mailbox->expert_counts + im.options.num_experts / R);
    }
    if (fresh) {
      fresh->num_recv_tokens = result.num_recv_tokens;
      fresh->num_recv_tokens_per_expert_host = result.num_recv_tokens_per_expert_host;
    }
  } else {
    result.num_rows = args.num_worst_tokens;
  }
  if (fresh) fresh->num_rows = result.num_rows;
  char* base = static_cast<char*>(im.memory.local());
  const int64_t rows = result.num_rows;
  result.recv_x = TensorRef::matrix(base + im.areas.recv_x, args.x.type, rows, H);
  if (fp8) result.recv_x_scales = TensorRef::matrix(base + im.areas.recv_scales, ScalarType::float32, rows, H / 128);
  result.recv_src_idx = TensorRef::vector(base + im.areas.recv_src_idx, ScalarType::int32, rows);
  result.recv_topk_idx = TensorRef::matrix(base + im.areas.recv_topk_idx, args.topk_idx.type, rows, K);
  result.recv_topk_weights = TensorRef::matrix(base + im.areas.recv_topk_weights, ScalarType::float32, rows, K);
  result.num_recv_tokens_per_expert =
      TensorRef::vector(handle->view().expert_counts, ScalarType::int32, im.options.num_experts / R);
  result.count_matrix = TensorRef::matrix(handle->view().count_matrix, ScalarType::int32, R, R);
  result.handle = fresh ? std::shared_ptr<const HtHandle>(fresh) : args.cached;
  result.finished = im.calls.end(streams, stream);
  im.latest_outputs = HtDispatchCopies{.recv_x = result.recv_x,
                                       .recv_x_scales = result.recv_x_scales,
                                       .recv_src_idx = result.recv_src_idx,
                                       .recv_topk_idx = result.recv_topk_idx,
                                       .recv_topk_weights = result.recv_topk_weights,
                                       .num_recv_tokens_per_expert = result.num_recv_tokens_per_expert};
  return result;
}

cudaEvent_t HtBuffer::copy_dispatch_outputs(const HtDispatchCopies& to, const HtStreams& streams) {
  Impl& im = *impl_;
  detail::ScopedRank scoped(im.team.rank());
  EPX_REQUIRE(im.latest_outputs.has_value(), "copy_dispatch_outputs before any dispatch on this buffer");
  const HtDispatchCopies& from = *im.latest_outputs;
  struct Copy {
    const char* name;
    const TensorRef& from;
    const TensorRef& to;
  };
  const Copy copies[] = {
      {"recv_x", from.recv_x, to.recv_x},
      {"recv_x_scales", from.recv_x_scales, to.recv_x_scales},
      {"recv_src_idx", from.recv_src_idx, to.recv_src_idx},
      {"recv_topk_idx", from.recv_topk_idx, to.recv_topk_idx},
      {"recv_topk_weights", from.recv_topk_weights, to.recv_topk_weights},
      {"num_recv_tokens_per_expert", from.num_recv_tokens_per_expert, to.num_recv_tokens_per_expert}};
  for (const Copy& c : copies) {
    EPX_REQUIRE(c.to.empty() || !c.from.empty(),
                std::string(c.name) + " is given, but the latest dispatch has no such output");
    if (!c.from.empty()) core::check_optional_tensor(c.to, {c.name, {c.from.type}, c.from.rows, c.from.cols});
  }
  const cudaStream_t stream = im.calls.begin(streams, "HT");
  for (const Copy& c : copies) {
    if (c.to.empty() || c.from.rows == 0) continue;
    const std::size_t element = element_size(c.from.type), width = std::size_t(c.from.cols) * element;
    const std::size_t from_pitch = std::size_t(c.from.row_stride) * element;
    const std::size_t to_pitch = std::size_t(c.to.row_stride) * element;
    // Dense on both sides: one linear copy. A 2D copy of the same rows made epx.deep_ep's dispatch ~50 us
    // slower (nvidia-h200, one rank, T = 4096, H = 7168: bench/results/*-session38-deep-ep-dispatch.log).
    if (from_pitch == width && to_pitch == width) {
      check_cuda(
          cudaMemcpyAsync(c.to.data, c.from.data, width * std::size_t(c.from.rows), cudaMemcpyDeviceToDevice, stream),
          "cudaMemcpyAsync(HT dispatch output)");
    } else {
      check_cuda(cudaMemcpy2DAsync(c.to.data, to_pitch, c.from.data, from_pitch, width, std::size_t(c.from.rows),
                                   cudaMemcpyDeviceToDevice, stream),
                 "cudaMemcpy2DAsync(HT dispatch output)");
    }
  }
  return im.calls.end(streams, stream);
}

HtCombineResult HtBuffer::combine(const HtCombineArgs& args, const HtStreams& streams) {
  Impl& im = *impl_;
  detail::ScopedRank scoped(im.team.rank());

  EPX_REQUIRE(args.handle != nullptr, "HT combine needs the handle of the dispatch it reverses");
  const HtHandle& handle = *args.handle;
  EPX_REQUIRE(handle.pool() == im.handles.get(), "the combine handle comes from another HtBuffer");
  const int64_t H = args.y.cols;
  core::check_tensor(args.y, {"y", {ScalarType::bf16}, -1, -1, true, 16});
  const char* base = static_cast<const char*>(im.memory.local());
  const bool y_in_place = args.y.data == base + im.areas.combine_input;
  EPX_REQUIRE(!y_in_place || args.y.row_stride == H,
              "y is the buffer's combine input, so it must be the dense view combine_input() returned");
  EPX_REQUIRE(args.y.rows >= handle.num_rows, "y has " + std::to_string(args.y.rows) + " rows; the dispatch returned " +
                                                  std::to_string(handle.num_rows));
  EPX_REQUIRE(H >= 128 && H % 128 == 0 && H <= im.options.hidden,
              "y has hidden " + std::to_string(H) + ": it must be a positive multiple of 128, at most the buffer's " +
                  std::to_string(im.options.hidden));
  core::check_optional_tensor(args.topk_weights, {"topk_weights", {ScalarType::float32}, args.y.rows, handle.topk});
  const bool weights = !args.topk_weights.empty();
  const bool weights_in_place = weights && args.topk_weights.data == base + im.areas.combine_input_weights;
  EPX_REQUIRE(!weights_in_place || args.topk_weights.row_stride == handle.topk,
              "topk_weights is the buffer's combine input, so it must be the dense view combine_input_weights() "
              "returned");
  core::check_optional_tensor(args.bias, {"bias", {ScalarType::bf16}, handle.num_tokens, H, true, 16});
  core::check_optional_tensor(args.second_bias, {"second_bias", {ScalarType::bf16}, handle.num_tokens, H, true, 16});
  // The kernel writes row t of the sums at out + t * H (and of the weights' at out_weights + t * K).
  core::check_optional_tensor(args.out, {"out", {ScalarType::bf16}, handle.num_tokens, H, true, 16});
  EPX_REQUIRE(args.out.empty() || args.out.row_stride == H || handle.num_tokens <= 1,
              "out must have row stride H (" + std::to_string(H) + "), got " + std::to_string(args.out.row_stride));
  core::check_optional_tensor(args.out_weights,
                              {"out_weights", {ScalarType::float32}, handle.num_tokens, handle.topk, true, 4});
  EPX_REQUIRE(args.out_weights.empty() || weights, "out_weights is given, topk_weights is not");
  EPX_REQUIRE(args.out_weights.empty() || args.out_weights.row_stride == handle.topk || handle.num_tokens <= 1,
              "out_weights must have row stride K (" + std::to_string(handle.topk) + "), got " +
                  std::to_string(args.out_weights.row_stride));
  EPX_REQUIRE(!args.out.empty() || im.combine_out != nullptr || handle.num_tokens == 0,
              "out is needed: this buffer was made without its own combine output (HtBufferOptions::combine_output)");
  uint16_t* out = args.out.empty() ? im.combine_out : static_cast<uint16_t*>(args.out.data);
  float* out_weights = !weights                   ? nullptr
                       : args.out_weights.empty() ? im.combine_out_weights
                                                  : static_cast<float*>(args.out_weights.data);

  const cudaStream_t stream = im.calls.begin(streams, "HT");
  kh::CombineArgs c{};
  c.buffer = im.view;
  c.handle = handle.view();
  c.y = static_cast<const uint16_t*>(args.y.data);
  c.y_row_stride = args.y.row_stride;
  c.weights = static_cast<const float*>(args.topk_weights.data);
  c.weights_row_stride = args.topk_weights.row_stride;
  c.bias[0] = {static_cast<const uint16_t*>(args.bias.data), args.bias.row_stride};
  c.bias[1] = {static_cast<const uint16_t*>(args.second_bias.data), args.second_bias.row_stride};
  c.out = out;
  c.out_weights = out_weights;
  c.num_rows = handle.num_rows;
  c.num_tokens = handle.num_tokens;
  c.topk = handle.topk;
  c.hidden = int32_t(H);
  c.blocks_done = &im.counters->combine_blocks_done;
  c.tokens_claimed = &im.counters->combine_tokens_claimed;
  // The peers read y (and the weights) from the buffer's combine input: the copy kernel copies the rows
  // they read there while they pull (the combine kernel starts beside it), unless the caller already
  // wrote them in place (combine_input()), or there are no peers. Without the copy kernel, the combine
  // kernel follows the caller's work in plain stream order.
  c.staged = im.team.size() > 1 && (!y_in_place || (weights && !weights_in_place)) && handle.num_rows > 0;
  if (c.staged) kh::launch_stage_combine_input(c, !y_in_place, weights && !weights_in_place, stream);
  kh::launch_combine(c, im.config.num_sms, stream);
  handle.mark_use(stream);

  HtCombineResult result;
  result.x = TensorRef::matrix(out, ScalarType::bf16, handle.num_tokens, H);
  if (out_weights != nullptr) {
    result.topk_weights = TensorRef::matrix(out_weights, ScalarType::float32, handle.num_tokens, handle.topk);
  }
  result.finished = im.calls.end(streams, stream);
  return result;
}

}  // namespace epx
