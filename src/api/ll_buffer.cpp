// LlBuffer: argument checks, buffer sets, and the launches of the LL kernels (src/kernels/ll/).
#include <cuda_runtime_api.h>

#include <cstring>
#include <string>

#include "api/call_order.hpp"
#include "core/cuda_check.hpp"
#include "core/ll_areas.hpp"
#include "core/validate.hpp"
#include "epx/ll.hpp"
#include "kernels/ll/ll_view.hpp"
#include "transport/team_impl.hpp"

namespace epx {

using detail::check_cuda;
namespace kl = kernels::ll;

// Every SM by default: LL calls are latency-bound, and their time is spent waiting for memory, so more
// CTAs keep more loads in flight. On a single-GPU team the ranks share the GPU and must all be resident.
LlConfig default_ll_config(int num_ranks, int sm_count, bool single_gpu) {
  LlConfig config;
  config.num_sms = single_gpu ? sm_count / num_ranks : sm_count;
  return config;
}

namespace {

// Per buffer set: what the host knows of its latest call (stream order decides the rest).
struct SetState {
  uint64_t generation = 0;       // calls made on the set
  bool receive_pending = false;  // a send_only call whose receive step has not been launched
  LlHandle issued;               // dispatch sets: the handle the set's latest dispatch returned
};

std::string str(int64_t v) { return std::to_string(v); }

bool aligned(const void* p, std::size_t alignment) { return reinterpret_cast<uintptr_t>(p) % alignment == 0; }

// The options a buffer can be made with for a team of `R` ranks (also what required_bytes accepts).
void check_options(const LlBufferOptions& options, int R) {
  EPX_REQUIRE(R >= 1 && R <= kMaxNvlinkRanks,
              "an LL buffer needs 1 to " + str(kMaxNvlinkRanks) + " ranks, got " + str(R));
  EPX_REQUIRE(options.max_tokens_per_rank >= 1 && options.max_tokens_per_rank <= core::kLlMaxTokens,
              "LlBufferOptions::max_tokens_per_rank must be in [1, " + str(core::kLlMaxTokens) + "], got " +
                  str(options.max_tokens_per_rank));
  EPX_REQUIRE(options.hidden >= 128 && options.hidden % 128 == 0 && options.hidden <= core::kLlMaxHidden,
              "LlBufferOptions::hidden must be a positive multiple of 128 up to " + str(core::kLlMaxHidden) + ", got " +
                  str(options.hidden));
  EPX_REQUIRE(options.max_topk >= 1 && options.max_topk <= core::kLlMaxTopk,
              "LlBufferOptions::max_topk must be in [1, " + str(core::kLlMaxTopk) + "], got " + str(options.max_topk));
  EPX_REQUIRE(options.num_experts >= R && options.num_experts % R == 0,
              "LlBufferOptions::num_experts (" + str(options.num_experts) +
                  ") must be a positive multiple of the team size (" + str(R) + ")");
  EPX_REQUIRE(
      options.num_experts <= core::kLlMaxExperts,
      "LlBufferOptions::num_experts must be at most " + str(core::kLlMaxExperts) + ", got " + str(options.num_experts));
}

}  // namespace

struct LlBuffer::Impl {
  Team& team;
  LlBufferOptions options;
  LlConfig config;
  core::LlAreas areas;
  SymmetricMemory memory;
  char* own = nullptr;                        // private device memory (core::LlAreas)
  kl::LlHostReport* report = nullptr;         // host-mapped
  kl::LlHostReport* report_device = nullptr;  // the same, device address
  uint16_t* combine_buffer = nullptr;         // combine_buffer(), once asked for
  api::CallOrder calls;
  kl::LlView view{};
  int sm_count = 0;
  uint64_t dispatches = 0, combines = 0;
  SetState dispatch_sets[core::kLlSets], combine_sets[core::kLlSets];

  Impl(Team& t, const LlBufferOptions& o) : team(t), options(o), calls(t) {}
  ~Impl() {
    if (report != nullptr) cudaFreeHost(report);
    cudaFree(own);
    cudaFree(combine_buffer);
  }

  int E_local() const { return options.num_experts / team.size(); }
  int64_t C() const { return areas.rows_per_expert(); }
  // The configuration to run with: num_sms = 0 becomes the default; checked.
  LlConfig resolve(const LlConfig& c) const;
  kl::LlView make_view() const;
  // Claims the next set of a kind; refuses while that set's earlier send_only call awaits its receive step.
  int next_set(SetState* sets, uint64_t& calls_made, const char* what);
  // Masks (or unmasks) ranks [first, last) but this one, ordered with the buffer's calls on `on`.
  void update_rank_mask(int first, int last, bool masked, cudaStream_t on, const char* what);
  std::function<void()> receive_step(SetState& state, const Streams& streams, std::function<void(cudaStream_t)> launch,
                                     std::function<void()> check = {});
  // Refuses a handle whose dispatch buffer set a later dispatch has reused; `what` names the caller.
  void require_current(const LlHandle& h, const char* what) const;
};

LlConfig LlBuffer::Impl::resolve(const LlConfig& requested) const {
  const LlConfig c =
      requested.num_sms == 0 ? default_ll_config(team.size(), sm_count, team.is_single_gpu()) : requested;
  core::check_num_sms("LlConfig::num_sms", c.num_sms, team.size(), team.is_single_gpu(), sm_count);
  return c;
}

kl::LlView LlBuffer::Impl::make_view() const {
  kl::LlView v{};
  v.team = team.impl().view();
  v.base = team.impl().symmetric_view(memory);
  v.own = own;
  v.freed = areas.freed;
  v.manifests = areas.manifests;
  v.expert_counts = areas.expert_counts;
  v.headers = areas.headers;
  v.payloads = areas.payloads;
  v.combine_rows = areas.combine_rows;
  v.combine_weights = areas.combine_weights;
  v.blocks_done = areas.blocks_done;
  v.pending_freed = areas.pending_freed;
  v.message_slots = areas.message_slots;
  v.entry_rows = areas.entry_rows;
  v.entry_weights = areas.entry_weights;
  v.home = areas.home;
  v.rank_mask = areas.rank_mask;
  v.max_tokens = options.max_tokens_per_rank;
  v.hidden = options.hidden;
  v.max_topk = options.max_topk;
  v.num_experts = options.num_experts;
  v.by_local_experts = core::Divisor::of(uint32_t(options.num_experts / team.size()));
  v.by_max_tokens = core::Divisor::of(uint32_t(options.max_tokens_per_rank));
  v.combine_slots = areas.combine_slots;
  v.mask_on_timeout = options.mask_on_timeout;
  v.host_report = report_device;
  return v;
}

int LlBuffer::Impl::next_set(SetState* sets, uint64_t& calls_made, const char* what) {
  const int set = int(calls_made % core::kLlSets);
  EPX_REQUIRE(!sets[set].receive_pending, std::string("LL ") + what +
                                              ": the receive step of the call two calls earlier (same buffer set) has "
                                              "not been run; run it first (see send_only in ll.hpp)");
  ++calls_made;
  ++sets[set].generation;
  return set;
}

void LlBuffer::Impl::require_current(const LlHandle& h, const char* what) const {
  EPX_REQUIRE(h.set >= 0 && h.set < core::kLlSets, std::string(what) + ": the handle names buffer set " + str(h.set) +
                                                       " (there are " + str(core::kLlSets) +
                                                       "): it was altered after its dispatch returned it");
  const SetState& state = dispatch_sets[h.set];
  EPX_REQUIRE(h.generation == state.generation,
              std::string(what) +
                  ": the handle is stale: its dispatch buffer set has been reused by a later dispatch (a handle lasts "
                  "until the dispatch two calls after its own)");
  // The device keeps its own record of the dispatch: a handle that says otherwise would make the
  // kernels wait for rows or weights that never come.
  const LlHandle& issued = state.issued;
  EPX_REQUIRE(h.num_tokens == issued.num_tokens && h.topk == issued.topk && h.hidden == issued.hidden &&
                  h.has_weights == issued.has_weights,
              std::string(what) +
                  ": the handle's num_tokens, topk, hidden or has_weights differ from what its dispatch returned; "
                  "pass the handle back as it was");
}

// With send_only: the closure that launches the receive step on the caller's stream, once, after
// check() (what else the step needs still to hold: a combine's, its handle).
std::function<void()> LlBuffer::Impl::receive_step(SetState& state, const Streams& streams,
                                                   std::function<void(cudaStream_t)> launch,
                                                   std::function<void()> check) {
  state.receive_pending = true;
  const uint64_t generation = state.generation;
  return [this, &state, generation, stream = streams.stream, launch = std::move(launch), check = std::move(check)] {
    detail::ScopedRank scoped(team.rank());
    EPX_REQUIRE(state.generation == generation && state.receive_pending,
                "LL receive step: already run, or its buffer set has been reused since");
    if (check) check();
    const Streams on{stream};
    const cudaStream_t s = calls.begin(on, "LL receive");
    launch(s);
    state.receive_pending = false;
    calls.end(on, s);
  };
}

LlBuffer::LlBuffer(Team& team, const LlBufferOptions& options, const LlConfig& config)
    : impl_(std::make_unique<Impl>(team, options)) {
  detail::ScopedRank scoped(team.rank());
  Impl& im = *impl_;
  const int R = team.size();
  check_options(options, R);
  check_cuda(cudaDeviceGetAttribute(&im.sm_count, cudaDevAttrMultiProcessorCount, team.device()),
             "cudaDeviceGetAttribute");
  im.config = im.resolve(config);
  kl::load_dispatch_kernel();  // before the collective allocation below: see detail::load_kernel
  kl::load_combine_kernel();
  kl::load_rank_mask_kernel();
  im.areas = core::ll_areas(options, R);
  im.memory = team.allocate_symmetric(im.areas.symmetric_bytes);
  check_cuda(cudaMalloc(reinterpret_cast<void**>(&im.own), im.areas.private_bytes), "cudaMalloc(LL private state)");
  // Zeroed on the buffer's own stream and waited for there only: a device-wide synchronisation would
  // wait for other ranks' kernels on a single-GPU team, which may be waiting for this rank.
  check_cuda(cudaMemsetAsync(im.own, 0, im.areas.private_bytes, im.calls.comm_stream()),
             "cudaMemsetAsync(LL private state)");
  check_cuda(cudaStreamSynchronize(im.calls.comm_stream()), "zeroing the LL private state");
  void* report = nullptr;
  check_cuda(cudaHostAlloc(&report, sizeof(kl::LlHostReport), cudaHostAllocMapped), "cudaHostAlloc(LL report)");
  std::memset(report, 0, sizeof(kl::LlHostReport));
  im.report = static_cast<kl::LlHostReport*>(report);
  check_cuda(cudaHostGetDevicePointer(reinterpret_cast<void**>(&im.report_device), report, 0),
             "cudaHostGetDevicePointer");
  im.view = im.make_view();
}

LlBuffer::~LlBuffer() {
  // A rank still masked may be gone: the collective release of the symmetric memory (and the team's
  // teardown) must not wait for it. The host mirror of the mask is as the last kernel left it.
  const Impl& im = *impl_;
  if (im.report == nullptr) return;
  const volatile uint32_t* masked = im.report->masked;
  for (int r = 0; r < im.team.size(); ++r) {
    if (masked[r] != 0u) {
      im.team.impl().mark_failed();
      return;
    }
  }
}

const LlBufferOptions& LlBuffer::options() const { return impl_->options; }
const LlConfig& LlBuffer::config() const { return impl_->config; }

void LlBuffer::set_config(const LlConfig& config) {
  detail::ScopedRank scoped(impl_->team.rank());
  impl_->config = impl_->resolve(config);
}

std::size_t LlBuffer::required_bytes(const LlBufferOptions& options, int num_ranks) {
  check_options(options, num_ranks);
  const core::LlAreas a = core::ll_areas(options, num_ranks);
  return a.symmetric_bytes + a.private_bytes;
}

std::size_t LlBuffer::buffer_bytes() const {
  const Impl& im = *impl_;
  const std::size_t combine_buffer =
      im.combine_buffer != nullptr ? std::size_t(im.E_local()) * im.C() * im.options.hidden * 2 : 0;
  return im.areas.symmetric_bytes + im.areas.private_bytes + combine_buffer;
}

LlBuffer::OutputBytes LlBuffer::output_bytes(bool use_fp8, bool use_ue8m0, int hidden) const {
  const Impl& im = *impl_;
  const std::size_t H = hidden == 0 ? im.options.hidden : hidden;
  const std::size_t rows = std::size_t(im.E_local()) * im.C();
  OutputBytes b{};
  b.x = rows * H * (use_fp8 ? 1 : 2);
  b.scales = !use_fp8 ? 0 : rows * sizeof(int32_t) * (use_ue8m0 ? H / 512 : H / 128);
  b.recv_count = sizeof(int32_t) * im.E_local();
  b.src_idx = sizeof(int32_t) * rows;
  b.layout_range = sizeof(LlRange) * im.E_local() * im.team.size();
  return b;
}

TensorRef LlBuffer::combine_buffer() {
  Impl& im = *impl_;
  detail::ScopedRank scoped(im.team.rank());
  const int64_t rows = im.E_local() * im.C();
  if (im.combine_buffer == nullptr) {
    check_cuda(cudaMalloc(reinterpret_cast<void**>(&im.combine_buffer), std::size_t(rows) * im.options.hidden * 2),
               "cudaMalloc(LL combine buffer)");
  }
  return TensorRef::matrix(im.combine_buffer, ScalarType::bf16, rows, im.options.hidden);
}

void LlBuffer::check_errors() {
  Impl& im = *impl_;
  detail::ScopedRank scoped(im.team.rank());
  im.team.check_device_errors();
  volatile kl::LlHostReport* e = im.report;
  if (e->input_error == 0) return;
  const std::string where = "topk_idx[" + str(e->token) + "][" + str(e->slot) + "] = " + str(e->value);
  e->input_error = 0;
  detail::fail(ErrorKind::invalid_argument, "LL dispatch: " + where + " is not an expert id in [-1, " +
                                                str(im.options.num_experts) +
                                                "); that entry was treated as -1 (not sent, and not combined)");
}

void LlBuffer::Impl::update_rank_mask(int first, int last, bool masked, cudaStream_t on, const char* what) {
  const Streams streams{on};
  const cudaStream_t stream = calls.begin(streams, what);
  kl::launch_update_rank_mask(view, first, last, masked, stream);
  calls.end(streams, stream);
}

void LlBuffer::set_rank_masked(int rank, bool masked, cudaStream_t on) {
  Impl& im = *impl_;
  detail::ScopedRank scoped(im.team.rank());
  EPX_REQUIRE(rank >= 0 && rank < im.team.size(),
              "set_rank_masked: rank " + str(rank) + " is not in [0, " + str(im.team.size()) + ")");
  EPX_REQUIRE(rank != im.team.rank(), "set_rank_masked: a rank cannot mask itself (rank " + str(rank) + ")");
  im.update_rank_mask(rank, rank + 1, masked, on, "set_rank_masked");
}

void LlBuffer::query_rank_mask(int32_t* out, cudaStream_t on) {
  const Streams streams{on};
  Impl& im = *impl_;
  detail::ScopedRank scoped(im.team.rank());
  EPX_REQUIRE(out != nullptr && aligned(out, 4),
              "query_rank_mask: out must be a 4-byte aligned device pointer to int32 [" + str(im.team.size()) + "]");
  const cudaStream_t stream = im.calls.begin(streams, "query_rank_mask");
  check_cuda(cudaMemcpyAsync(out, im.own + im.areas.rank_mask, sizeof(uint32_t) * im.team.size(),
                             cudaMemcpyDeviceToDevice, stream),
             "cudaMemcpyAsync(rank mask)");
  im.calls.end(streams, stream);
}

void LlBuffer::clear_rank_mask(cudaStream_t on) {
  detail::ScopedRank scoped(impl_->team.rank());
  impl_->update_rank_mask(0, impl_->team.size(), false, on, "clear_rank_mask");
}

LlDispatchResult LlBuffer::dispatch(const LlDispatchArgs& args, const Streams& streams) {
  Impl& im = *impl_;
  detail::ScopedRank scoped(im.team.rank());
  const int64_t T = args.x.rows, H = args.x.cols;
  EPX_REQUIRE(T <= im.options.max_tokens_per_rank, "LL dispatch of " + str(T) +
                                                       " tokens, more than the buffer's max_tokens_per_rank (" +
                                                       str(im.options.max_tokens_per_rank) + ")");
  core::check_tensor(args.x, {"x", {ScalarType::bf16}, T, -1, true, 16});
  EPX_REQUIRE(H >= 128 && H % 128 == 0 && H <= im.options.hidden,
              "x has hidden " + str(H) + ": it must be a positive multiple of 128, at most the buffer's " +
                  str(im.options.hidden));
  core::check_tensor(args.topk_idx, {"topk_idx", {ScalarType::int64, ScalarType::int32}, T});
  const int64_t K = args.topk_idx.cols;
  EPX_REQUIRE(K >= 1 && K <= im.options.max_topk,
              "topk_idx has " + str(K) + " columns; the buffer allows 1 to " + str(im.options.max_topk));
  core::check_optional_tensor(args.topk_weights, {"topk_weights", {ScalarType::float32}, T, K});
  EPX_REQUIRE(args.use_fp8 || !args.round_scale, "round_scale needs use_fp8");
  EPX_REQUIRE(args.round_scale || !args.use_ue8m0, "use_ue8m0 needs round_scale (UE8M0 holds powers of two only)");
  EPX_REQUIRE(!args.use_ue8m0 || H % 512 == 0,
              "use_ue8m0 needs a hidden size that is a multiple of 512, got " + str(H));
  const LlDispatchOutputs& out = args.out;
  EPX_REQUIRE(out.x != nullptr && aligned(out.x, 16), "out.x must be a 16-byte aligned device pointer");
  EPX_REQUIRE(!args.use_fp8 || (out.scales != nullptr && aligned(out.scales, 4)),
              "out.scales must be a 4-byte aligned device pointer with use_fp8");
  EPX_REQUIRE(out.recv_count != nullptr && aligned(out.recv_count, 4),
              "out.recv_count must be a 4-byte aligned pointer");
  EPX_REQUIRE(out.src_idx != nullptr && aligned(out.src_idx, 4), "out.src_idx must be a 4-byte aligned pointer");
  EPX_REQUIRE(out.layout_range != nullptr && aligned(out.layout_range, 8),
              "out.layout_range must be an 8-byte aligned pointer");
  EPX_REQUIRE(args.cumulative_recv_count == nullptr || aligned(args.cumulative_recv_count, 4),
              "cumulative_recv_count must be 4-byte aligned");
  EPX_REQUIRE(aligned(args.cumulative_wait_cycles, 8), "cumulative_wait_cycles must be 8-byte aligned");

  const int64_t groups = args.use_ue8m0 ? H / 512 : H / 128;
  LlScalesLayout scales = out.scales_layout;
  if (scales.expert_stride == 0 && scales.row_stride == 0 && scales.col_stride == 0) {
    scales = LlScalesLayout{im.C() * groups, groups, 1};
  }
  const cudaStream_t stream = im.calls.begin(streams, "LL dispatch");
  const int set = im.next_set(im.dispatch_sets, im.dispatches, "dispatch");

  kl::DispatchParams p{};
  p.v = im.view;
  p.set = set;
  p.x = static_cast<const uint16_t*>(args.x.data);
  p.x_row_stride = args.x.row_stride;
  p.hidden = int32_t(H);
  p.num_tokens = int32_t(T);
  p.topk = int32_t(K);
  p.topk_idx = args.topk_idx.data;
  p.topk_int64 = args.topk_idx.type == ScalarType::int64;
  p.topk_row_stride = args.topk_idx.row_stride;
  p.weights = static_cast<const float*>(args.topk_weights.data);
  p.weights_row_stride = args.topk_weights.row_stride;
  p.fp8 = args.use_fp8;
  p.round_scale = args.round_scale;
  p.ue8m0 = args.use_ue8m0;
  p.out_x = out.x;
  p.out_scales = out.scales;
  p.scales_layout = scales;
  p.recv_count = out.recv_count;
  p.src_idx = out.src_idx;
  p.layout_range = out.layout_range;
  p.cumulative_recv_count = args.cumulative_recv_count;
  p.v.wait_cycles = reinterpret_cast<unsigned long long*>(args.cumulative_wait_cycles);
  p.phases = args.send_only ? kl::kSend : kl::kSend | kl::kReceive;
  const int blocks = im.config.num_sms;
  kl::launch_dispatch(p, blocks, stream);

  LlDispatchResult result;
  LlHandle& h = result.handle;
  h.buffer = this;
  h.set = set;
  h.generation = im.dispatch_sets[set].generation;
  h.num_tokens = int(T);
  h.topk = int(K);
  h.hidden = int(H);
  h.has_weights = !args.topk_weights.empty() || T == 0;  // a rank with no tokens has no weights to give
  im.dispatch_sets[set].issued = h;
  if (args.send_only) {
    p.phases = kl::kReceive;
    result.receive = im.receive_step(im.dispatch_sets[set], streams,
                                     [p, blocks](cudaStream_t s) { kl::launch_dispatch(p, blocks, s); });
  }
  result.finished = im.calls.end(streams, stream);
  return result;
}

LlCombineResult LlBuffer::combine(const LlCombineArgs& args, const Streams& streams) {
  Impl& im = *impl_;
  detail::ScopedRank scoped(im.team.rank());
  const LlHandle& h = args.handle;
  EPX_REQUIRE(h.buffer == this, "LL combine: the handle comes from another LlBuffer (or is empty)");
  im.require_current(h, "LL combine");
  EPX_REQUIRE(!im.dispatch_sets[h.set].receive_pending,
              "LL combine: run the dispatch's receive step first (it was send_only)");
  const int64_t T = h.num_tokens, K = h.topk, H = h.hidden;
  const int64_t rows = im.E_local() * im.C();
  core::check_tensor(args.y, {"y", {ScalarType::bf16}, -1, H, true, 16});
  // The kernel works out a row's offset in 32 x 32-bit products (combine.cu, load_y).
  EPX_REQUIRE(args.y.row_stride < (int64_t(1) << 31),
              "y's row stride (" + str(args.y.row_stride) + " elements) must be below 2^31");
  EPX_REQUIRE(args.y.rows >= rows,
              "y has " + str(args.y.rows) + " rows; combine reads E_local * R * max_tokens = " + str(rows));
  core::check_tensor(args.out, {"out", {ScalarType::bf16}, T, H, true, 16});
  const bool naive = args.order == LlCombineOrder::naive;
  // A rank with no tokens needs no weights (a [0][K] tensor may come with no data pointer).
  if (naive) {
    EPX_REQUIRE(T == 0 || !args.topk_weights.empty(), "LL combine, naive order: topk_weights [T][K] are required");
  } else if (T > 0 && h.has_weights) {
    EPX_REQUIRE(args.topk_weights.empty(),
                "LL combine, local order: the dispatch had topk_weights and the expert side sums with those; pass "
                "them here only when the dispatch had none (or with the naive order)");
  } else if (T > 0) {
    EPX_REQUIRE(!args.topk_weights.empty(),
                "LL combine, local order: the dispatch had no topk_weights, so pass them here ([T][K] float32; "
                "they go to the expert side at the start of the call)");
  }
  core::check_optional_tensor(args.topk_weights, {"topk_weights", {ScalarType::float32}, T, K});
  EPX_REQUIRE(aligned(args.cumulative_wait_cycles, 8), "cumulative_wait_cycles must be 8-byte aligned");

  const cudaStream_t stream = im.calls.begin(streams, "LL combine");
  const int set = im.next_set(im.combine_sets, im.combines, "combine");
  kl::CombineParams p{};
  p.v = im.view;
  p.v.wait_cycles = reinterpret_cast<unsigned long long*>(args.cumulative_wait_cycles);
  p.set = set;
  p.dispatch_set = h.set;
  p.y = static_cast<const uint16_t*>(args.y.data);
  p.y_row_stride = args.y.row_stride;
  p.hidden = int32_t(H);
  p.num_tokens = int32_t(T);
  p.topk = int32_t(K);
  p.naive = naive;
  p.weights = static_cast<const float*>(args.topk_weights.data);
  p.weights_row_stride = args.topk_weights.row_stride;
  p.out = static_cast<uint16_t*>(args.out.data);
  p.out_row_stride = args.out.row_stride;
  p.phases = args.send_only ? kl::kSend : kl::kSend | kl::kReceive;
  const int blocks = im.config.num_sms;
  kl::launch_combine(p, blocks, stream);

  LlCombineResult result;
  if (args.send_only) {
    p.phases = kl::kReceive;
    // The receive step reads the handle's routing, so it must run while the handle lasts.
    result.receive = im.receive_step(
        im.combine_sets[set], streams, [p, blocks](cudaStream_t s) { kl::launch_combine(p, blocks, s); },
        [&im, h] { im.require_current(h, "LL combine receive step"); });
  }
  result.finished = im.calls.end(streams, stream);
  return result;
}

}  // namespace epx
