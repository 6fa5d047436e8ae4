#include "bench/ll_bench.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>

#include "bench/check.hpp"
#include "bench/device_data.hpp"
#include "bench/inputs.hpp"
#include "bench/kernel_clock.hpp"
#include "bench/other_code.cuh"
#include "bench/phase_trace_report.hpp"
#include "bench/team_sync.hpp"
#include "bench/timing.hpp"
#include "core/cuda_check.hpp"
#include "core/ll_areas.hpp"
#include "epx/ll.hpp"
#include "epx/reference/ll.hpp"

namespace epx::bench {
namespace {

using detail::check_cuda;

// The header that travels with each dispatch message (slots, local expert ids, block rows, weights), as
// stamped words; a payload travels as lines (core::kLlLineBytes, 112 row bytes each; FP8 scales ride in
// the stamp vectors).
constexpr double kMessageHeaderBytes = core::kLlHeaderWords * sizeof(core::LlWord);
constexpr uint16_t kBf16NaN = 0x7fc0;

// ---- Expert outputs (combine's y) ----------------------------------------------------------------------
// y[e][row][h] on rank r is a pure function of (r, local expert e, the row's source rank s and token t,
// h): the GPU fills its own y from its dispatch's layout, the host every rank's y from the reference's
// layout, and the two agree whatever order the rows came in. A token's experts give different rows, so
// a row combined under the wrong expert (or the wrong weight) changes the result.

struct YShape {
  int ranks, tokens, hidden, local_experts, capacity;  // capacity C = R * T_max rows per local expert
};

constexpr uint16_t expert_output(const Draw& draw, const YShape& y, int e, int s, int t, int h) {
  return ref::random_bf16(draw(((uint64_t(e) * y.ranks + s) * y.tokens + t) * y.hidden + h));
}

// Grid (C, E_local): one CTA per row. Rows past recv_count[e] become NaN: combine must never read them.
__global__ void fill_expert_outputs(uint16_t* y, const int32_t* recv_count, const int32_t* src_idx,
                                    const LlRange* layout_range, YShape shape, Draw draw) {
  const int row = blockIdx.x, e = blockIdx.y;
  int s = -1;
  if (row < recv_count[e]) {
    for (int r = 0; r < shape.ranks; ++r) {
      const LlRange range = layout_range[e * shape.ranks + r];
      if (row >= range.begin && row < range.begin + range.count) s = r;
    }
  }
  const int t = s >= 0 ? src_idx[e * shape.capacity + row] : -1;
  uint16_t* out = y + (std::size_t(e) * shape.capacity + row) * shape.hidden;
  for (int h = threadIdx.x; h < shape.hidden; h += blockDim.x) {
    out[h] = s >= 0 ? expert_output(draw, shape, e, s, t, h) : kBf16NaN;
  }
}

// The same y on the host, from a (canonical) reference result; rows combine never reads stay zero.
ref::Tensor3<uint16_t> expert_outputs(const ref::LlRecv& recv, const Draw& draw, const YShape& shape) {
  ref::Tensor3<uint16_t> y(shape.local_experts, shape.capacity, shape.hidden);
  for (int e = 0; e < shape.local_experts; ++e) {
    for (int s = 0; s < shape.ranks; ++s) {
      const ref::RowRange range = recv.layout_range.at(e, s);
      for (int row = range.begin; row < range.begin + range.count; ++row) {
        uint16_t* out = &y.at(e, row, 0);
        for (int h = 0; h < shape.hidden; ++h) out[h] = expert_output(draw, shape, e, s, recv.src_idx.at(e, row), h);
      }
    }
  }
  return y;
}

// ---- CUDA graphs -----------------------------------------------------------------------------------------

// The same calls captured twice on `stream`. Consecutive calls of a kind use the buffer's two sets in
// turn and a capture bakes its set in, so replaying the pair alternately (A, B, A, B, ...) keeps the
// alternation that ll.hpp's rules ask for. Replays do not move the buffer's host-side set counter: an
// even number of replays leaves the next call (captured or not) on the set it expects.
class GraphPair {
 public:
  GraphPair(cudaStream_t stream, const std::function<void(cudaStream_t)>& calls)
      : a_(capture_graph(stream, calls)), b_(capture_graph(stream, calls)) {}

  // Events around each replay (one graph launch each), every replay after `before`; the median etc.
  Timing time(cudaStream_t stream, int warmup, int replays, const std::function<void(cudaStream_t)>& before) const {
    if ((warmup + replays) % 2 != 0) throw std::logic_error("LL bench: graph replays must come in pairs");
    int replay = 0;
    return time_on_stream(stream, warmup, replays, before, [&](cudaStream_t s) { launch(s, replay++); });
  }

  // `rounds` rounds, each after `before`: events around `replays` launches in a row (A, B, A, ...);
  // per call, a round's time divided by `replays`.
  Timing time_in_a_row(cudaStream_t stream, int rounds, int replays,
                       const std::function<void(cudaStream_t)>& before) const {
    if (replays % 2 != 0) throw std::logic_error("LL bench: graph replays must come in pairs");
    return bench::time_in_a_row(stream, rounds, replays, before, [&](cudaStream_t s, int i) { launch(s, i); });
  }

  // Replay i of a sequence that starts with A.
  void launch(cudaStream_t stream, int i) const { launch_graph(i % 2 == 0 ? a_ : b_, stream); }

 private:
  GraphExec a_, b_;
};

// ---- The bench -------------------------------------------------------------------------------------------

// Caller-allocated dispatch outputs, sized by LlBuffer::output_bytes.
struct DispatchOutputs {
  LlBuffer::OutputBytes bytes{};
  DeviceMemory x, scales, recv_count, src_idx, layout_range;

  DispatchOutputs(const LlBuffer& buffer, bool fp8)
      : bytes(buffer.output_bytes(fp8, false)),
        x(device_alloc(bytes.x)),
        scales(device_alloc(bytes.scales)),
        recv_count(device_alloc(bytes.recv_count)),
        src_idx(device_alloc(bytes.src_idx)),
        layout_range(device_alloc(bytes.layout_range)) {}

  LlDispatchOutputs view(bool fp8) const {
    LlDispatchOutputs out;
    out.x = x.get();
    out.scales = fp8 ? scales.get() : nullptr;
    out.recv_count = static_cast<int32_t*>(recv_count.get());
    out.src_idx = static_cast<int32_t*>(src_idx.get());
    out.layout_range = static_cast<LlRange*>(layout_range.get());
    return out;
  }

  // All bits set everywhere before a checked run: what the dispatch leaves unwritten cannot pass for
  // an earlier run's result.
  void poison(cudaStream_t stream) const {
    const std::pair<const DeviceMemory*, std::size_t> parts[] = {{&x, bytes.x},
                                                                 {&scales, bytes.scales},
                                                                 {&recv_count, bytes.recv_count},
                                                                 {&src_idx, bytes.src_idx},
                                                                 {&layout_range, bytes.layout_range}};
    for (const auto& [p, n] : parts) check_cuda(cudaMemsetAsync(p->get(), 0xff, n, stream), "cudaMemsetAsync");
  }
};

// Bytes of one op per rank and direction (DESIGN §3). NVLink: what crosses it for this rank's tokens,
// going out (dispatch) or coming back (combine). Algorithm: DeepEP's convention, received (token,
// expert) rows x H x 2, FP8 scaled by (1 + 4/128) / 2.
struct OpBytes {
  double nvlink = 0, algo = 0;
};

struct Traffic {
  int64_t hidden = 0;
  int64_t remote_messages = 0;  // (token, destination rank != me): dispatch messages, local-combine rows back
  int64_t remote_slots = 0;     // (token, slot) with a remote expert: naive-combine rows back
  int64_t received_rows = 0;    // (token, local expert) rows this rank receives, its own included

  OpBytes dispatch(bool fp8) const {
    const double H = double(hidden), payload = double(core::kLlLineBytes) * core::ll_row_lines(int(fp8 ? H : 2 * H));
    return {double(remote_messages) * (payload + kMessageHeaderBytes),
            double(received_rows) * 2 * H * (fp8 ? (1 + 4.0 / 128) / 2 : 1.0)};
  }
  OpBytes combine(LlCombineOrder order) const {
    // Rows back travel as lines (core::kLlLineBytes, 124 bytes of row in each).
    const int64_t rows_back = order == LlCombineOrder::local ? remote_messages : remote_slots;
    const double row_bytes = double(core::ll_combine_row_line_bytes(int(hidden)));
    return {double(rows_back) * row_bytes, double(received_rows) * 2 * hidden};
  }
  // The local order with the weights given to combine: a stamped word per remote slot goes out first.
  OpBytes combine_weights_given() const {
    OpBytes b = combine(LlCombineOrder::local);
    b.nvlink += double(remote_slots) * sizeof(core::LlWord);
    return b;
  }
};

// One call's timings: one launch at a time, each after a team barrier (the rows' time_us); in a
// row (GraphPair::time_in_a_row); in one graph (time_in_one_graph); cold: one launch at a time after
// other code ran on every SM; and kernel: the launches of the first, timed by CUPTI from the call's first
// kernel's start to its last kernel's end (all zero where the bench cannot measure it: KernelClock).
struct CallTiming {
  Timing launch, in_a_row, in_one_graph, cold, kernel;
};

struct Measured {
  const char* op;
  const char* dtype;
  const char* order;  // "" for dispatch alone
  RankTiming timing;
  Timing in_a_row{}, in_one_graph{}, cold{}, kernel{};  // zero for the send/receive step rows
};

Measured measured(const char* op, const char* dtype, const char* order, CallTiming timing, OpBytes bytes) {
  Measured m{op, dtype, order, RankTiming{timing.launch, bytes.nvlink, bytes.algo}};
  m.in_a_row = timing.in_a_row;
  m.in_one_graph = timing.in_one_graph;
  m.cold = timing.cold;
  m.kernel = timing.kernel;
  return m;
}

// ll.hpp promises more than the reference's contract: rows already in its order (source blocks from
// rank + 1 up, wrapping, the rank's own last; tokens ascending within one), so the GPU's result must equal
// that form of itself (`documented`: ref::ll_in_epx_order's).
void check_documented_order(Checker& check, const std::string& what, const ref::LlRecv& got,
                            const ref::LlRecv& documented) {
  for (int64_t e = 0; e < got.src_idx.rows; ++e) {
    bool same = true;
    for (int64_t row = 0; row < got.recv_count[e]; ++row)
      same &= got.src_idx.at(e, row) == documented.src_idx.at(e, row);
    for (int64_t s = 0; s < got.layout_range.cols; ++s) {
      if (got.layout_range.at(e, s).count > 0) same &= got.layout_range.at(e, s) == documented.layout_range.at(e, s);
    }
    if (!same) {
      check.fail(what + ": the rows of local expert " + std::to_string(e) +
                 " are not in the order ll.hpp promises (source blocks from rank + 1 up, the rank's own last, then "
                 "tokens ascending)");
      return;
    }
  }
}

std::vector<int32_t> flatten(const ref::Matrix<ref::RowRange>& ranges) {
  std::vector<int32_t> flat;
  for (const ref::RowRange& r : ranges.data) flat.insert(flat.end(), {r.begin, r.count});
  return flat;
}

// Brings `got`, rank `rank`'s, to canonical order (ll_canonicalize also checks that its ranges tile the
// rows) and compares it with `want` bit for bit.
void compare_recv(Checker& check, const std::string& what, int rank, const ref::LlRecv& got, const ref::LlRecv& want) {
  ref::LlRecv canonical, documented;
  try {
    canonical = ref::ll_canonicalize(got);
    documented = ref::ll_in_epx_order(got, rank);
  } catch (const std::invalid_argument& e) {
    check.fail(what + ": " + e.what());
    return;
  }
  check_documented_order(check, what, got, documented);
  const int64_t H = std::max(want.x_bf16.dim2, want.x_fp8.dim2);
  check.equal(what + " recv_count", canonical.recv_count, want.recv_count);
  check.equal(what + " layout_range (begin, count)", flatten(canonical.layout_range), flatten(want.layout_range),
              2 * want.layout_range.cols);
  check.equal(what + " src_idx", canonical.src_idx.data, want.src_idx.data, want.src_idx.cols);
  check.equal(what + " x", canonical.x_bf16.data, want.x_bf16.data, H);
  check.equal(what + " x", canonical.x_fp8.data, want.x_fp8.data, H);
  check.equal(what + " scales", canonical.x_scales.data, want.x_scales.data, want.x_scales.dim2);
}

const char* name(LlCombineOrder order) { return order == LlCombineOrder::local ? "local" : "naive"; }

class LlBench {
 public:
  // `kernel_clock`: open_kernel_clock's; time_ops measures kernel time where it is not null.
  LlBench(Team& team, const LlBenchOptions& o, KernelClock* kernel_clock)
      : team_(team),
        o_(o),
        R_(team.size()),
        me_(team.rank()),
        shape_{R_, o.tokens, o.hidden, o.experts / R_, R_ * o.tokens},
        stream_(new_stream()),
        buffer_(team, LlBufferOptions{o.tokens, o.hidden, o.topk, o.experts},
                LlConfig{o.num_sms}),  // 0: the buffer resolves the default
        fp8_(buffer_, true),
        bf16_(buffer_, false),
        y_(device_alloc(std::size_t(shape_.local_experts) * shape_.capacity * o.hidden * 2)),
        out_local_(device_alloc(std::size_t(o.tokens) * o.hidden * 2)),
        out_naive_(device_alloc(std::size_t(o.tokens) * o.hidden * 2)),
        other_code_sink_(device_alloc(sizeof(uint32_t))),
        sm_count_(device_sm_count(team.device())),
        kernel_clock_(kernel_clock) {}

  // Runs dispatch FP8, dispatch BF16 and combine in both orders once, then compares every output with
  // the global CPU reference. The GPU calls come first, back to back, so that the ranks reach each
  // collective together (device waits are bounded by the team's timeout); the reference runs after.
  bool check() {
    const Routing mine = make_routing(o_.seed, me_, o_.tokens, o_.topk, o_.experts);
    topk_idx_ = upload(mine.topk_idx.data, stream());
    weights_ = upload(mine.weights.data, stream());
    x_ = upload(make_bf16_tokens(o_.seed, me_, o_.tokens, o_.hidden).data, stream());
    fp8_.poison(stream());
    bf16_.poison(stream());
    poison_outputs();
    buffer_.dispatch(dispatch_args(true), Streams{stream()});
    const LlHandle handle = buffer_.dispatch(dispatch_args(false), Streams{stream()}).handle;
    fill_y(bf16_);
    buffer_.combine(combine_args(LlCombineOrder::local, handle), Streams{stream()});
    buffer_.combine(combine_args(LlCombineOrder::naive, handle), Streams{stream()});
    check_cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
    buffer_.check_errors();
    const ref::LlRecv got_fp8 = fetch(fp8_, true), got_bf16 = fetch(bf16_, false);
    const std::vector<uint16_t> got_local = download_out(LlCombineOrder::local);
    const std::vector<uint16_t> got_naive = download_out(LlCombineOrder::naive);
    // The local order with the weights given to combine (a dispatch without them), into out_local_ again.
    poison_outputs();
    const LlHandle unweighted = buffer_.dispatch(dispatch_args(false, false), Streams{stream()}).handle;
    buffer_.combine(combine_args(LlCombineOrder::local, unweighted), Streams{stream()});
    const std::vector<uint16_t> got_local_cw = download_out(LlCombineOrder::local);
    buffer_.check_errors();

    traffic_ = count_traffic(mine);
    Checker check(me_, "LL");
    const ref::ExpertPlacement placement(o_.experts, R_);
    std::vector<ref::LlTokens> tokens;
    for (int r = 0; r < R_; ++r) {
      const Routing routing = make_routing(o_.seed, r, o_.tokens, o_.topk, o_.experts);
      tokens.push_back({make_bf16_tokens(o_.seed, r, o_.tokens, o_.hidden), routing.topk_idx, routing.weights});
    }
    {
      std::vector<ref::LlRecv> want = ref::ll_dispatch(tokens, placement, o_.tokens, {.use_fp8 = true});
      compare_recv(check, "dispatch fp8", me_, got_fp8, want[me_]);
      checked_fp8_ = std::move(want[me_]);
    }
    std::vector<ref::LlRecv> want = ref::ll_dispatch(tokens, placement, o_.tokens, {});
    compare_recv(check, "dispatch bf16", me_, got_bf16, want[me_]);
    for (int32_t count : want[me_].recv_count) traffic_.received_rows += count;

    // Every expert side's y, from the reference's layout (the payload is no longer needed).
    std::vector<ref::Tensor3<uint16_t>> y;
    std::vector<ref::TopkIdx> topk_idx;
    std::vector<ref::Matrix<float>> weights;
    for (int r = 0; r < R_; ++r) {
      want[r].x_bf16 = {};
      y.push_back(expert_outputs(want[r], Draw(o_.seed, r, What::expert_output), shape_));
      topk_idx.push_back(tokens[r].topk_idx);
      weights.push_back(tokens[r].topk_weights);
    }
    for (const LlCombineOrder order : {LlCombineOrder::local, LlCombineOrder::naive}) {
      const auto ref_order = order == LlCombineOrder::local ? ref::LlCombineOrder::local : ref::LlCombineOrder::naive;
      const std::vector<ref::Matrix<uint16_t>> out = ref::ll_combine(y, want, topk_idx, weights, placement, ref_order);
      check.equal("combine (" + std::string(name(order)) + " order) out",
                  order == LlCombineOrder::local ? got_local : got_naive, out[me_].data, o_.hidden);
      if (order == LlCombineOrder::local) checked_local_ = out[me_].data;
    }
    check.equal("combine (local order, weights given to combine) out", got_local_cw, checked_local_, o_.hidden);
    return check.ok();
  }

  // Each op: one call (dispatch; combine; or dispatch then combine) captured in a GraphPair, replayed
  // o_.warmup + o_.replays times, each replay after a team barrier; then kLlInARowRounds rounds of
  // o_.replays replays in a row, each round after a team barrier; then kLlCallsPerGraph calls in one
  // graph, replayed as the first (time_in_one_graph); then as the first, with other code
  // (other_code_kernel) run on every SM before each barrier, so that the call fetches its own code
  // again, as between the other kernels of a decode step. No L2 flush: the inputs (~2 MB) stay in L2 as
  // they would in a decode step, and LL ops are bound by latency, not by HBM.
  std::vector<Measured> time_ops() {
    const LlCombineOrder local = LlCombineOrder::local, naive = LlCombineOrder::naive;
    std::vector<Measured> out;
    out.push_back(measured("dispatch", "fp8", "", time(dispatch_call(true)), traffic_.dispatch(true)));
    out.push_back(measured("dispatch", "bf16", "", time(dispatch_call(false)), traffic_.dispatch(false)));
    // The combines replay on the handle of one dispatch made here: no dispatch runs in between.
    const LlHandle handle = buffer_.dispatch(dispatch_args(false), Streams{stream()}).handle;
    out.push_back(measured("combine", "bf16", "local", time(combine_call(local, handle)), traffic_.combine(local)));
    out.push_back(measured("combine", "bf16", "naive", time(combine_call(naive, handle)), traffic_.combine(naive)));
    // The local order with the weights given to combine (DeepEP's API), on a dispatch without them.
    const LlHandle unweighted = buffer_.dispatch(dispatch_args(false, false), Streams{stream()}).handle;
    out.push_back(measured("combine", "bf16", "local_cw", time(combine_call(local, unweighted)),
                           traffic_.combine_weights_given()));
    const CallTiming both = time([&](cudaStream_t s) {
      const LlHandle h = buffer_.dispatch(dispatch_args(true), Streams{s}).handle;
      buffer_.combine(combine_args(local, h), Streams{s});
    });
    const OpBytes d = traffic_.dispatch(true), c = traffic_.combine(local);
    out.push_back(measured("dispatch_combine", "fp8", "local", both, {d.nvlink + c.nvlink, d.algo + c.algo}));
    finish();
    return out;
  }

  // Dispatch FP8 and combine (local order) as their two steps (send_only, then the receive step), each
  // step timed alone, one launch after a team barrier: the send step after the previous call's receive
  // step; the receive step after its own sends, so that every peer's data is there when it starts. What
  // each step costs when it waits for nothing (the floor of a timed launch included). Their outputs (the
  // last replay's) are compared with the reference's after the timing: `ok` says whether they equal it.
  std::vector<Measured> time_steps(bool& ok) {
    Checker check(me_, "LL");
    std::vector<Measured> out;
    const auto add = [&](const char* op, const char* dtype, const char* order, const Timing& t) {
      out.push_back(Measured{op, dtype, order, RankTiming{t, 0, 0}});
    };
    fp8_.poison(stream());
    const std::pair<Timing, Timing> dispatch = time_two_steps([&](cudaStream_t s) { return dispatch_sends(s); });
    add("dispatch_send", "fp8", "", dispatch.first);
    add("dispatch_receive", "fp8", "", dispatch.second);
    finish();
    compare_recv(check, "dispatch fp8 (send_only, then its receive step)", me_, fetch(fp8_, true), checked_fp8_);
    const LlHandle handle = buffer_.dispatch(dispatch_args(true), Streams{stream()}).handle;
    poison_outputs();
    const std::pair<Timing, Timing> combine = time_two_steps([&](cudaStream_t s) {
      LlCombineArgs a = combine_args(LlCombineOrder::local, handle);
      a.send_only = true;
      return buffer_.combine(a, Streams{s}).receive;
    });
    add("combine_send", "bf16", "local", combine.first);
    add("combine_receive", "bf16", "local", combine.second);
    finish();
    check.equal("combine (local order; send_only, then its receive step) out", download_out(LlCombineOrder::local),
                checked_local_, o_.hidden);
    ok = check.ok();
    return out;
  }

  // --trace: the phase traces (print_phase_trace) of dispatch FP8 and BF16, and of combine (local
  // order) on the handle of one dispatch made here; each call a graph replay after a team barrier, as
  // they are timed (GraphPair: an even number of calls keeps the buffer's set alternation).
  void trace_calls() {
    const auto trace_graphs = [&](const char* name, transport::TracePoint first,
                                  const std::function<void(cudaStream_t)>& call) {
      const GraphPair graphs(stream(), call);
      int replay = 0;
      print_phase_trace(
          team_, stream(), name, first, [&] { enqueue_team_barrier(team_, stream()); },
          [&] { graphs.launch(stream(), replay++); });
    };
    for (const bool fp8 : {true, false}) {
      trace_graphs(fp8 ? "ll_dispatch_fp8" : "ll_dispatch_bf16", transport::TracePoint::ll_dispatch_start,
                   dispatch_call(fp8));
    }
    // Dispatch FP8's receive step alone, every peer's data there: its sends (send_only), a team barrier,
    // the trace reset, then the step.
    std::function<void()> receive;
    print_phase_trace(
        team_, stream(), "ll_dispatch_fp8_receive_step", transport::TracePoint::ll_dispatch_start,
        [&] {
          receive = dispatch_sends(stream());
          enqueue_team_barrier(team_, stream());
          team_.impl().reset_trace(stream());
        },
        [&] { receive(); });
    // Combine (local order) with the weights given to dispatch, then to combine.
    for (const bool weights_given : {false, true}) {
      const LlHandle handle = buffer_.dispatch(dispatch_args(false, !weights_given), Streams{stream()}).handle;
      trace_graphs(weights_given ? "ll_combine_local_cw" : "ll_combine_local", transport::TracePoint::ll_combine_start,
                   combine_call(LlCombineOrder::local, handle));
    }
  }

  // For each of kLlTuneSms up to the smallest SM count of any rank (every rank tries the same ones, in
  // the same order): sets num_sms, checks dispatch FP8 and combine (local) again, then times them.
  // Returns per setting {combine, dispatch}; throws when a setting's outputs differ on any rank.
  std::vector<RankTiming> tune(std::vector<int>& settings) {
    const std::vector<double> sm_counts = all_gather(team_, stream(), {double(sm_count_)});
    const double fewest = *std::min_element(sm_counts.begin(), sm_counts.end());
    std::vector<RankTiming> out;
    for (const int sms : kLlTuneSms) {
      if (sms > fewest) continue;
      buffer_.set_config(LlConfig{sms});
      LlHandle handle;
      require_every_rank(team_, stream(), check_again(handle),
                         "LL outputs with num_sms " + std::to_string(sms) + " differ from the checked ones");
      out.push_back({time_launch(combine_call(LlCombineOrder::local, handle))});
      out.push_back({time_launch(dispatch_call(true))});
      settings.push_back(sms);
    }
    finish();
    return out;
  }

  cudaStream_t stream() const { return stream_.get(); }
  int sms() const { return buffer_.config().num_sms; }
  std::size_t buffer_bytes() const { return buffer_.buffer_bytes(); }

 private:
  TensorRef topk_idx() const { return TensorRef::matrix(topk_idx_.get(), ScalarType::int64, o_.tokens, o_.topk); }
  TensorRef out(LlCombineOrder order) const {
    void* data = order == LlCombineOrder::local ? out_local_.get() : out_naive_.get();
    return TensorRef::matrix(data, ScalarType::bf16, o_.tokens, o_.hidden);
  }

  // `weights`: given to dispatch (else combine gets them).
  LlDispatchArgs dispatch_args(bool fp8, bool weights = true) const {
    LlDispatchArgs a;
    a.x = TensorRef::matrix(x_.get(), ScalarType::bf16, o_.tokens, o_.hidden);
    a.topk_idx = topk_idx();
    if (weights) a.topk_weights = TensorRef::matrix(weights_.get(), ScalarType::float32, o_.tokens, o_.topk);
    a.use_fp8 = fp8;
    a.out = (fp8 ? fp8_ : bf16_).view(fp8);
    return a;
  }

  // Local order takes the weights given to dispatch, if it had them; naive order gets them here.
  LlCombineArgs combine_args(LlCombineOrder order, const LlHandle& handle) const {
    LlCombineArgs a;
    a.y = TensorRef::matrix(y_.get(), ScalarType::bf16, int64_t(shape_.local_experts) * shape_.capacity, o_.hidden);
    if (order == LlCombineOrder::naive || !handle.has_weights) {
      a.topk_weights = TensorRef::matrix(weights_.get(), ScalarType::float32, o_.tokens, o_.topk);
    }
    a.handle = handle;
    a.order = order;
    a.out = out(order);
    return a;
  }

  // Dispatch FP8 with send_only on `s`: its sends now; returns its receive step.
  std::function<void()> dispatch_sends(cudaStream_t s) {
    LlDispatchArgs a = dispatch_args(true);
    a.send_only = true;
    return buffer_.dispatch(a, Streams{s}).receive;
  }
  std::function<void(cudaStream_t)> dispatch_call(bool fp8) {
    return [this, fp8](cudaStream_t s) { buffer_.dispatch(dispatch_args(fp8), Streams{s}); };
  }
  std::function<void(cudaStream_t)> combine_call(LlCombineOrder order, const LlHandle& handle) {
    return [this, order, handle](cudaStream_t s) { buffer_.combine(combine_args(order, handle), Streams{s}); };
  }
  void barrier(cudaStream_t s) { enqueue_team_barrier(team_, s); }
  // other_code_kernel on every SM (two CTAs per SM, so that the scheduler leaves none out), then the
  // barrier: its kernel is small, and the call's code is what is left to fetch.
  void other_code_then_barrier(cudaStream_t s) {
    other_code_kernel<1><<<2 * sm_count_, 32, 0, s>>>(0x5A5A5A5Au, static_cast<uint32_t*>(other_code_sink_.get()));
    detail::check_launch("other_code_kernel");
    barrier(s);
  }
  // One launch at a time, each after a team barrier (the rows' time_us, and what the tuning compares).
  Timing time_launch(const std::function<void(cudaStream_t)>& call) {
    return GraphPair(stream(), call).time(stream(), o_.warmup, o_.replays, [&](cudaStream_t s) { barrier(s); });
  }
  // time_steps for one kind: `send_only(stream)` makes a send_only call and returns its receive step;
  // each set's send step and receive step are captured as graphs of their own and replayed in the
  // call's order (send A, receive A, send B, receive B, ...). Returns {send step, receive step}.
  std::pair<Timing, Timing> time_two_steps(const std::function<std::function<void()>(cudaStream_t)>& send_only) {
    GraphExec sends[2], receives[2];
    for (int i = 0; i < 2; ++i) {
      std::function<void()> receive;
      sends[i] = capture_graph(stream(), [&](cudaStream_t s) { receive = send_only(s); });
      receives[i] = capture_graph(stream(), [&](cudaStream_t) { receive(); });
    }
    int next = 0;          // the set whose send step comes next
    bool pending = false;  // the other set's receive step is still to run
    const Timing send = time_on_stream(
        stream(), o_.warmup, o_.replays,
        [&](cudaStream_t s) {
          if (pending) launch_graph(receives[1 - next], s);
          barrier(s);
        },
        [&](cudaStream_t s) {
          launch_graph(sends[next], s);
          pending = true;
          next = 1 - next;
        });
    launch_graph(receives[1 - next], stream());
    const Timing receive = time_on_stream(
        stream(), o_.warmup, o_.replays,
        [&](cudaStream_t s) {
          launch_graph(sends[next], s);
          barrier(s);
        },
        [&](cudaStream_t s) {
          launch_graph(receives[next], s);
          next = 1 - next;
        });
    return {send, receive};
  }

  // Every timing of a call (time_ops).
  CallTiming time(const std::function<void(cudaStream_t)>& call) {
    const GraphPair graphs(stream(), call);
    const auto before = [&](cudaStream_t s) { barrier(s); };
    const auto cold = [&](cudaStream_t s) { other_code_then_barrier(s); };
    return CallTiming{graphs.time(stream(), o_.warmup, o_.replays, before),
                      graphs.time_in_a_row(stream(), kLlInARowRounds, o_.replays, before),
                      time_in_one_graph(call, before), graphs.time(stream(), o_.warmup, o_.replays, cold),
                      kernel_time(call)};
  }

  // CallTiming::in_one_graph: kLlCallsPerGraph calls captured in one graph (they alternate the sets within
  // it, and an even number leaves the buffer's set counter as it was), each replay after before(stream),
  // events around its launch; per call, a replay's time divided by its calls. Each LL kernel is a
  // programmatic dependent of the one before it (launch.hpp), so its CTAs start as that kernel's CTAs exit, as
  // in a caller's decode graph, where the router and the expert GEMM come between them; the graph's
  // launch and the start after the barrier are shared by its calls.
  Timing time_in_one_graph(const std::function<void(cudaStream_t)>& call,
                           const std::function<void(cudaStream_t)>& before) {
    return time_graph_per_call(stream(), o_.warmup, o_.replays, kLlCallsPerGraph, call, before);
  }

  // CallTiming::kernel: the call captured again and replayed as `launch` is (time_launch: each replay
  // after a team barrier, a kernel outside the graph, left out), under graph_kernel_time.
  Timing kernel_time(const std::function<void(cudaStream_t)>& call) {
    return graph_kernel_time(kernel_clock_, stream(), o_.warmup, o_.replays, [&] { time_launch(call); });
  }

  void finish() {
    check_cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
    buffer_.check_errors();
  }

  void poison_outputs() {
    for (const LlCombineOrder order : {LlCombineOrder::local, LlCombineOrder::naive}) {
      check_cuda(cudaMemsetAsync(out(order).data, 0xff, std::size_t(o_.tokens) * o_.hidden * 2, stream()),
                 "cudaMemsetAsync");
    }
  }

  void fill_y(const DispatchOutputs& from) {
    fill_expert_outputs<<<dim3(shape_.capacity, shape_.local_experts), 256, 0, stream()>>>(
        static_cast<uint16_t*>(y_.get()), static_cast<const int32_t*>(from.recv_count.get()),
        static_cast<const int32_t*>(from.src_idx.get()), static_cast<const LlRange*>(from.layout_range.get()), shape_,
        Draw(o_.seed, me_, What::expert_output));
    detail::check_launch("fill_expert_outputs");
  }

  std::vector<uint16_t> download_out(LlCombineOrder order) const { return download<uint16_t>(out(order), stream()); }

  // The dispatch outputs on the host, as a reference result (row-major scales: scales_layout is zero).
  ref::LlRecv fetch(const DispatchOutputs& from, bool fp8) const {
    const int64_t E = shape_.local_experts, C = shape_.capacity, H = o_.hidden;
    auto need = [&](std::size_t have, std::size_t want, const char* what) {
      if (have < want) {
        throw std::logic_error("LL bench: LlBuffer::output_bytes gives " + std::to_string(have) + " bytes for " + what +
                               ", ll.hpp's shape needs " + std::to_string(want));
      }
    };
    ref::LlRecv got;
    if (fp8) {
      got.x_fp8 = ref::Tensor3<uint8_t>(E, C, H);
      got.x_scales = ref::Tensor3<float>(E, C, H / 128);
      need(from.bytes.x, got.x_fp8.data.size(), "x");
      need(from.bytes.scales, got.x_scales.data.size() * sizeof(float), "scales");
      download_into(got.x_fp8.data.data(), from.x.get(), got.x_fp8.data.size(), stream());
      download_into(got.x_scales.data.data(), from.scales.get(), got.x_scales.data.size(), stream());
    } else {
      got.x_bf16 = ref::Tensor3<uint16_t>(E, C, H);
      need(from.bytes.x, got.x_bf16.data.size() * 2, "x");
      download_into(got.x_bf16.data.data(), from.x.get(), got.x_bf16.data.size(), stream());
    }
    got.src_idx = ref::Matrix<int32_t>(E, C);
    got.layout_range = ref::Matrix<ref::RowRange>(E, R_);
    need(from.bytes.recv_count, E * sizeof(int32_t), "recv_count");
    need(from.bytes.src_idx, got.src_idx.data.size() * sizeof(int32_t), "src_idx");
    need(from.bytes.layout_range, got.layout_range.data.size() * sizeof(LlRange), "layout_range");
    got.recv_count = download<int32_t>(from.recv_count.get(), E, stream());
    download_into(got.src_idx.data.data(), from.src_idx.get(), got.src_idx.data.size(), stream());
    const std::vector<LlRange> ranges = download<LlRange>(from.layout_range.get(), E * R_, stream());
    for (std::size_t i = 0; i < ranges.size(); ++i) got.layout_range.data[i] = {ranges[i].begin, ranges[i].count};
    return got;
  }

  // This rank's remote messages and slots: the reference's dedup messages to other ranks.
  Traffic count_traffic(const Routing& mine) const {
    Traffic t;
    t.hidden = o_.hidden;
    const ref::ExpertPlacement placement(o_.experts, R_);
    for (const ref::LlMessage& m : ref::ll_messages(mine.topk_idx, mine.weights, me_, placement)) {
      if (m.dst_rank == me_) continue;
      ++t.remote_messages;
      t.remote_slots += int64_t(m.experts.size());
    }
    return t;
  }

  // Dispatch FP8 and combine (local) once more with the current config; their outputs must equal the
  // checked pass's bit for bit (which equal the reference's, hence the Checker's wording). `handle`:
  // that dispatch's, for the timed combines that follow.
  bool check_again(LlHandle& handle) {
    Checker check(me_, "LL");
    const std::string at = " (num_sms " + std::to_string(sms()) + ")";
    fp8_.poison(stream());
    poison_outputs();
    handle = buffer_.dispatch(dispatch_args(true), Streams{stream()}).handle;
    buffer_.combine(combine_args(LlCombineOrder::local, handle), Streams{stream()});
    finish();
    compare_recv(check, "dispatch fp8" + at, me_, fetch(fp8_, true), checked_fp8_);
    check.equal("combine (local order) out" + at, download_out(LlCombineOrder::local), checked_local_, o_.hidden);
    return check.ok();
  }

  Team& team_;
  const LlBenchOptions& o_;
  int R_, me_;
  YShape shape_;
  Stream stream_;
  LlBuffer buffer_;
  DispatchOutputs fp8_, bf16_;
  DeviceMemory y_, out_local_, out_naive_;
  DeviceMemory topk_idx_, weights_, x_;
  DeviceMemory other_code_sink_;  // other_code_kernel's result (never written in practice)
  int sm_count_;
  KernelClock* kernel_clock_;
  Traffic traffic_;
  ref::LlRecv checked_fp8_;              // the reference's FP8 dispatch result for this rank
  std::vector<uint16_t> checked_local_;  // the reference's local-order combine
};

}  // namespace

void validate_ll_bench_options(const LlBenchOptions& o, int ranks) {
  auto require = [](bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("LL bench: " + what);
  };
  require(o.tokens >= 1 && o.hidden >= 128 && o.topk >= 1 && o.experts >= 1,
          "--ll-tokens, --topk and --experts must be positive and --hidden at least 128");
  require(o.hidden % 128 == 0, "--hidden must be a multiple of 128 (one FP8 scale per 128 columns)");
  require(o.topk <= o.experts, "--topk must be at most --experts (each token picks distinct experts)");
  require(o.experts % ranks == 0, "--experts must be a multiple of the number of ranks");
  require(o.num_sms >= 0, "--ll-sms must be >= 0 (0: the library's default)");
  require(o.replays >= 2 && o.warmup >= 0 && o.replays % 2 == 0 && o.warmup % 2 == 0,
          "replays must be >= 2, and warmup and replays even (graph replays come in pairs)");
}

LlBenchResult run_ll_bench(Team& team, const LlBenchOptions& options, KernelClock* kernel_clock) {
  validate_ll_bench_options(options, team.size());
  const auto start = std::chrono::steady_clock::now();
  LlBench bench(team, options, kernel_clock);
  require_every_rank(team, bench.stream(), bench.check(), "LL outputs differ from the CPU reference");
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  if (team.rank() == 0) {
    std::printf("LL: every rank's outputs equal the CPU reference (checked in %.1f s); timing...\n", took.count());
    std::fflush(stdout);
  }

  LlBenchResult result;
  result.ranks = team.size();
  result.tokens = options.tokens;
  result.hidden = options.hidden;
  result.topk = options.topk;
  result.experts = options.experts;
  result.replays = options.replays;
  result.buffer_bytes = bench.buffer_bytes();
  result.message_header_bytes = int(kMessageHeaderBytes);
  std::vector<Measured> measured = bench.time_ops();
  bool steps_ok = false;
  for (const Measured& m : bench.time_steps(steps_ok)) measured.push_back(m);
  require_every_rank(team, bench.stream(), steps_ok,
                     "LL outputs of send_only calls and their receive steps differ from the CPU reference");
  // One gather: every op's one-launch timing, then every op's in-a-row timing, its cold one, its kernel one,
  // its in-one-graph one.
  const std::size_t n = measured.size();
  std::vector<RankTiming> timings(5 * n);
  for (std::size_t i = 0; i < n; ++i) {
    timings[i] = measured[i].timing;
    timings[n + i] = {measured[i].in_a_row};
    timings[2 * n + i] = {measured[i].cold};
    timings[3 * n + i] = {measured[i].kernel};
    timings[4 * n + i] = {measured[i].in_one_graph};
  }
  const std::vector<TeamTiming> gathered = gather_timings(team, bench.stream(), timings);
  for (std::size_t i = 0; i < n; ++i) {
    LlBenchRow row;
    static_cast<TeamTiming&>(row) = gathered[i];
    row.in_a_row_us = gathered[n + i].time_us;
    row.cold_us = gathered[2 * n + i].time_us;
    row.in_one_graph_us = gathered[4 * n + i].time_us;
    // Zero on any rank (not measured there) leaves it unmeasured: the slowest rank's median is then
    // another rank's, which would understate it.
    const std::vector<double>& kernel = gathered[3 * n + i].median_us_per_rank;
    if (std::all_of(kernel.begin(), kernel.end(), [](double us) { return us > 0; })) {
      row.kernel_us = gathered[3 * n + i].time_us;
    }
    row.op = measured[i].op;
    row.dtype = measured[i].dtype;
    row.order = measured[i].order;
    row.sms = bench.sms();
    row.checked = true;  // only reached when every rank's check passed
    result.rows.push_back(row);
  }
  if (options.trace) bench.trace_calls();  // before tune(), which leaves the last num_sms it tried
  if (options.tune) {
    if (team.rank() == 0) {
      std::printf("LL: tuning num_sms (each setting checked against the outputs above)...\n");
      std::fflush(stdout);
    }
    std::vector<int> settings;
    const std::vector<RankTiming> tuned = bench.tune(settings);
    const std::vector<TeamTiming> all = gather_timings(team, bench.stream(), tuned);
    double best_us = 0;
    for (std::size_t i = 0; i < settings.size(); ++i) {
      const LlTuning t{settings[i], all[2 * i + 1].time_us, all[2 * i].time_us};
      result.tuning.push_back(t);
      // On a tie the fewer SMs (tried first): they leave more to overlapping compute.
      if (i == 0 || t.dispatch_us + t.combine_us < best_us) {
        best_us = t.dispatch_us + t.combine_us;
        result.best_sms = t.sms;
      }
    }
  }
  return result;
}

}  // namespace epx::bench
