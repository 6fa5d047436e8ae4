#include "bench/ht_bench.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <stdexcept>
#include <utility>

#include "bench/check.hpp"
#include "bench/device_data.hpp"
#include "bench/inputs.hpp"
#include "bench/phase_trace_report.hpp"
#include "bench/team_sync.hpp"
#include "bench/timing.hpp"
#include "core/cuda_check.hpp"
#include "epx/ht.hpp"
#include "epx/reference/fp8_cast.hpp"
#include "epx/reference/ht.hpp"
#include "epx/reference/layout.hpp"
#include "transport/device/phase_trace.hpp"

namespace epx::bench {
namespace {

using detail::check_cuda;

// ---- Inputs every rank can regenerate (bench/inputs.hpp) --------------------------------------------

Routing make_routing(const HtBenchOptions& o, int rank) {
  return bench::make_routing(o.seed, rank, o.tokens, o.topk, o.experts);
}

// One rank's dispatch input. Values are never zero: BF16 with exponents 2^-4 .. 2^3, FP8 E4M3 normals
// (exponent field 1..14, so never 0 or NaN), scales amax / 448 for amax in [2^-5, 2^3).
ref::HtTokens make_tokens(const HtBenchOptions& o, int rank, ref::Dtype dtype, const Routing& routing) {
  ref::HtTokens in;
  in.dtype = dtype;
  in.topk_idx = routing.topk_idx;
  in.topk_weights = routing.weights;
  const std::size_t n = std::size_t(o.tokens) * o.hidden;
  if (dtype == ref::Dtype::bf16) {
    in.x_bf16 = make_bf16_tokens(o.seed, rank, o.tokens, o.hidden);
    return in;
  }
  const Draw draw(o.seed, rank, What::x_fp8), scale(o.seed, rank, What::scales);
  in.x_fp8 = ref::Matrix<uint8_t>(o.tokens, o.hidden);
  for (std::size_t i = 0; i < n; ++i) {
    const uint64_t b = draw(i);
    in.x_fp8.data[i] = uint8_t(((b & 1) << 7) | ((1 + (b >> 1) % 14) << 3) | ((b >> 8) & 7));
  }
  in.x_scales = ref::StridedMatrix<float>::row_major(o.tokens, o.hidden / ref::kFp8GroupSize);
  for (std::size_t i = 0; i < in.x_scales.data.size(); ++i) {
    const uint64_t b = scale(i);
    in.x_scales.data[i] = std::ldexp(1.0f + float(b >> 41) * 0x1p-23f, int(b % 8) - 5) / 448.0f;
  }
  return in;
}

std::vector<ref::HtTokens> every_rank_tokens(const HtBenchOptions& o, ref::Dtype dtype,
                                             const std::vector<Routing>& routing) {
  std::vector<ref::HtTokens> tokens;
  for (int r = 0; r < int(routing.size()); ++r) tokens.push_back(make_tokens(o, r, dtype, routing[r]));
  return tokens;
}

// ---- The bench -------------------------------------------------------------------------------------

HtConfig config_for(const HtBenchOptions& o, int ranks) {
  HtConfig config = default_ht_config(ranks);
  if (o.num_sms > 0) config.num_sms = o.num_sms;
  return config;
}

struct Measured {
  const char* op;
  const char* dtype;
  int sms;
  Timing timing;
  double nvlink_bytes, algo_bytes;
};

struct Received {  // one dispatch's outputs, on the host
  int64_t num_recv_tokens = 0, num_rows = 0;
  std::vector<uint16_t> x_bf16;
  std::vector<uint8_t> x_fp8;
  std::vector<float> scales;
  std::vector<int32_t> src_idx;
  std::vector<int64_t> topk_idx;
  std::vector<float> weights;
  std::vector<int32_t> expert_counts, expert_counts_host;
};

struct Outputs {  // everything one run of every op gave this rank
  std::vector<int32_t> rank_counts, expert_counts;
  std::vector<uint8_t> in_rank;
  Received bf16, cached, fp8;
  std::vector<uint16_t> combined;
};

void compare_dispatch(Checker& check, const HtBenchOptions& o, const std::string& what, const Received& got,
                      const ref::HtRecv& want) {
  if (got.num_recv_tokens != want.num_recv_tokens || got.num_rows != want.num_recv_tokens) {
    check.fail(what + ": received " + std::to_string(got.num_recv_tokens) + " rows (" + std::to_string(got.num_rows) +
               " returned), the reference " + std::to_string(want.num_recv_tokens));
    return;
  }
  const int64_t H = o.hidden, K = o.topk;
  check.equal(what + " recv_x", got.x_bf16, want.x_bf16.data, H);
  check.equal(what + " recv_x", got.x_fp8, want.x_fp8.data, H);
  check.equal(what + " recv_x_scales", got.scales, want.x_scales.data, H / ref::kFp8GroupSize);
  check.equal(what + " recv_src_idx", got.src_idx, want.src_idx);
  check.equal(what + " recv_topk_idx", got.topk_idx, want.topk_idx.data, K);
  check.equal(what + " recv_topk_weights", got.weights, want.topk_weights.data, K);
  check.equal(what + " num_recv_tokens_per_expert", got.expert_counts, want.num_recv_tokens_per_expert);
  check.equal(what + " num_recv_tokens_per_expert_host", got.expert_counts_host, want.num_recv_tokens_per_expert);
}

// Regenerates every rank's inputs and runs them through the reference; rank `me`'s slice must equal
// `got` bit for bit. Returns rank me's tokens per destination rank (for the byte accounting).
std::vector<int32_t> compare_with_reference(const HtBenchOptions& o, int num_ranks, int me, const Outputs& got,
                                            Checker& check) {
  const ref::ExpertPlacement placement(o.experts, num_ranks);
  std::vector<Routing> routing;
  for (int r = 0; r < num_ranks; ++r) routing.push_back(make_routing(o, r));
  const ref::Layout layout = ref::compute_layout(routing[me].topk_idx, placement);
  check.equal("layout num_tokens_per_rank", got.rank_counts, layout.num_tokens_per_rank);
  check.equal("layout num_tokens_per_expert", got.expert_counts, layout.num_tokens_per_expert);
  check.equal("layout is_token_in_rank", got.in_rank, layout.is_token_in_rank.data, num_ranks);
  {
    ref::HtDispatchResult want = ref::ht_dispatch(every_rank_tokens(o, ref::Dtype::bf16, routing), placement);
    compare_dispatch(check, o, "dispatch bf16", got.bf16, want.recv[me]);
    compare_dispatch(check, o, "cached dispatch bf16", got.cached, want.recv[me]);
    // Every expert side sent back exactly the rows it received: combine the reference's rows.
    std::vector<ref::HtCombineInput> y(num_ranks);
    for (int r = 0; r < num_ranks; ++r) y[r].y = std::move(want.recv[r].x_bf16);
    check.equal("combine x", got.combined, ref::ht_combine(y, want.handle)[me].x.data, o.hidden);
  }
  const ref::HtDispatchResult want = ref::ht_dispatch(every_rank_tokens(o, ref::Dtype::fp8, routing), placement);
  compare_dispatch(check, o, "dispatch fp8", got.fp8, want.recv[me]);
  return layout.num_tokens_per_rank;
}

std::size_t l2_bytes(int device) {
  int bytes = 0;
  check_cuda(cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, device), "cudaDeviceGetAttribute(L2 size)");
  return std::size_t(bytes);
}

class HtBench {
 public:
  HtBench(Team& team, const HtBenchOptions& o)
      : team_(team),
        o_(o),
        R_(team.size()),
        me_(team.rank()),
        stream_(new_stream()),
        buffer_(team, HtBufferOptions{o.tokens, o.hidden, o.topk, o.experts}, config_for(o, team.size())),
        check_(team.rank(), "HT"),
        l2_flush_bytes_(2 * l2_bytes(team.device())),
        l2_flush_(device_alloc(l2_flush_bytes_)) {}

  // Runs every op once on this rank's inputs, then compares the outputs with the global CPU reference.
  // The GPU work comes first, with no heavy CPU work in between, so that the ranks reach each collective
  // together (device waits are bounded by the team's timeout); the reference runs afterwards. Keeps what
  // the timed runs need: device inputs, layout outputs, the BF16 dispatch's handle and combine input y.
  bool check() {
    const Routing mine = make_routing(o_, me_);
    topk_idx_ = upload(mine.topk_idx.data, stream());
    weights_ = upload(mine.weights.data, stream());
    x_bf16_ = upload(make_tokens(o_, me_, ref::Dtype::bf16, mine).x_bf16.data, stream());
    const ref::HtTokens fp8 = make_tokens(o_, me_, ref::Dtype::fp8, mine);
    x_fp8_ = upload(fp8.x_fp8.data, stream());
    scales_ = upload(fp8.x_scales.data, stream());  // row-major [T][H/128]
    Outputs got = run_once();
    rows_to_rank_ = compare_with_reference(o_, R_, me_, got, check_);
    if (o_.tune) checked_ = std::move(got);
    return check_.ok();
  }

  // Every op, `repetitions` times each with the buffer's current config. Unless `every_op`, only those
  // tune() compares: dispatch BF16 (exact form), dispatch FP8 and combine.
  std::vector<Measured> time_ops(int repetitions, bool every_op) {
    const auto before = [&](cudaStream_t s) { before_call(s); };
    const auto time = [&](const std::function<void(cudaStream_t)>& op) {
      return time_on_stream(stream_.get(), o_.warmup, repetitions, before, op);
    };
    const int sms = buffer_.config().num_sms;
    const HtDispatchArgs cached = cached_args();
    const HtCombineArgs combine = combine_args();
    const HtCombineArgs in_place = in_place_combine_args();

    const auto layout = [&](cudaStream_t s) { buffer_.get_layout(topk_idx(), layout_out_, HtStreams{s}); };
    // A dropped handle goes back to the buffer's pool (no free, no device synchronisation).
    const auto dispatch_bf16 = [&](cudaStream_t s) { buffer_.dispatch(bf16_args(), HtStreams{s}); };
    const auto dispatch_fp8 = [&](cudaStream_t s) { buffer_.dispatch(fp8_args(), HtStreams{s}); };
    const auto combine_bf16 = [&](cudaStream_t s) { buffer_.combine(combine, HtStreams{s}); };
    const auto combine_zero_copy = [&](cudaStream_t s) { buffer_.combine(in_place, HtStreams{s}); };
    const auto dispatch_cached = [&](cudaStream_t s) { buffer_.dispatch(cached, HtStreams{s}); };

    std::vector<Measured> rows;
    if (every_op) rows.push_back({"layout", "int64", 0, time(layout), 0, 0});
    rows.push_back(
        {"dispatch", "bf16", sms, time(dispatch_bf16), dispatch_nvlink_bytes(false), dispatch_algo_bytes(false)});
    rows.push_back(
        {"dispatch", "fp8", sms, time(dispatch_fp8), dispatch_nvlink_bytes(true), dispatch_algo_bytes(true)});
    rows.push_back({"combine", "bf16", sms, time(combine_bf16), combine_nvlink_bytes(), dispatch_algo_bytes(false)});
    rows.push_back({"combine_zero_copy", "bf16", sms, time(combine_zero_copy), combine_nvlink_bytes(),
                    dispatch_algo_bytes(false)});
    if (every_op) {
      rows.push_back({"dispatch_cached", "bf16", sms, time(dispatch_cached), dispatch_nvlink_bytes(false),
                      dispatch_algo_bytes(false)});
    }
    check_cuda(cudaStreamSynchronize(stream_.get()), "cudaStreamSynchronize");
    team_.check_device_errors();
    return rows;
  }

  // For each of kHtTuneSms up to the smallest SM count of any rank (every rank tries the same ones, in
  // the same order): sets num_sms, checks the outputs again, then times the tuned ops. Throws when a
  // setting's outputs differ on any rank.
  std::vector<Measured> tune() {
    const std::vector<double> sm_counts = all_gather(team_, stream(), {double(device_sm_count(team_.device()))});
    const double fewest = *std::min_element(sm_counts.begin(), sm_counts.end());
    std::vector<Measured> rows;
    for (const int sms : kHtTuneSms) {
      if (sms > fewest) continue;
      buffer_.set_config(HtConfig{sms});
      require_every_rank(team_, stream(), check_again(),
                         "HT outputs with num_sms " + std::to_string(sms) + " differ from the checked ones");
      for (const Measured& m : time_ops(o_.tune_repetitions, false)) rows.push_back(m);
    }
    return rows;
  }

  // --trace: each dispatch form's phase trace (print_phase_trace), from the layout's start (the
  // dispatch's for the cached form), then each combine form's, from its first kernel's start.
  void trace_calls() {
    const HtDispatchArgs cached = cached_args();
    const std::pair<const char*, HtDispatchArgs> forms[] = {
        {"dispatch_bf16", bf16_args()}, {"dispatch_fp8", fp8_args()}, {"dispatch_cached", cached}};
    for (const auto& [name, args] : forms) {
      print_phase_trace(
          team_, stream(), name,
          args.cached ? transport::TracePoint::ht_dispatch_start : transport::TracePoint::ht_layout_start,
          [&] { before_call(stream()); }, [&] { buffer_.dispatch(args, HtStreams{stream()}); });
    }
    const HtCombineArgs combine = combine_args(), in_place = in_place_combine_args();
    print_phase_trace(
        team_, stream(), "combine", transport::TracePoint::ht_copy_start, [&] { before_call(stream()); },
        [&] { buffer_.combine(combine, HtStreams{stream()}); });
    print_phase_trace(
        team_, stream(), "combine_zero_copy", transport::TracePoint::ht_combine_start, [&] { before_call(stream()); },
        [&] { buffer_.combine(in_place, HtStreams{stream()}); });
  }

  cudaStream_t stream() const { return stream_.get(); }
  std::size_t buffer_bytes() const { return buffer_.buffer_bytes(); }

 private:
  // Untimed before every timed or traced call: evict L2 (inputs come from HBM, as DESIGN §3 asks),
  // then a barrier so that every rank's call starts together.
  void before_call(cudaStream_t s) {
    check_cuda(cudaMemsetAsync(l2_flush_.get(), 0, l2_flush_bytes_, s), "cudaMemsetAsync(L2 flush)");
    enqueue_team_barrier(team_, s);
  }

  TensorRef topk_idx() const { return TensorRef::matrix(topk_idx_.get(), ScalarType::int64, o_.tokens, o_.topk); }

  HtDispatchArgs bf16_args() const {
    HtDispatchArgs a;
    a.x = TensorRef::matrix(x_bf16_.get(), ScalarType::bf16, o_.tokens, o_.hidden);
    a.topk_idx = topk_idx();
    a.topk_weights = TensorRef::matrix(weights_.get(), ScalarType::float32, o_.tokens, o_.topk);
    return a;
  }

  HtDispatchArgs cached_args() const {
    HtDispatchArgs a = bf16_args();
    a.cached = handle_;
    return a;
  }

  HtCombineArgs combine_args() const {
    HtCombineArgs a;
    a.y = TensorRef::matrix(y_.get(), ScalarType::bf16, num_recv_, o_.hidden);
    a.handle = handle_;
    return a;
  }

  // combine_args() with y copied into the buffer's combine input first (as an expert GEMM could write it
  // there), so that combine reads it in place: no copy.
  HtCombineArgs in_place_combine_args() {
    HtCombineArgs a = combine_args();
    a.y = buffer_.combine_input(num_recv_, o_.hidden);
    check_cuda(
        cudaMemcpyAsync(a.y.data, y_.get(), std::size_t(num_recv_) * o_.hidden * 2, cudaMemcpyDeviceToDevice, stream()),
        "cudaMemcpyAsync(y into the combine input)");
    return a;
  }

  HtDispatchArgs fp8_args() const {
    HtDispatchArgs a = bf16_args();
    a.x = TensorRef::matrix(x_fp8_.get(), ScalarType::fp8_e4m3, o_.tokens, o_.hidden);
    a.x_scales = TensorRef::matrix(scales_.get(), ScalarType::float32, o_.tokens, o_.hidden / ref::kFp8GroupSize);
    return a;
  }

  Outputs run_once() {
    Outputs got;
    rank_counts_ = device_alloc(sizeof(int32_t) * R_);
    expert_counts_ = device_alloc(sizeof(int32_t) * o_.experts);
    in_rank_ = device_alloc(std::size_t(o_.tokens) * R_);
    layout_out_ = HtLayout{static_cast<int32_t*>(rank_counts_.get()), static_cast<int32_t*>(expert_counts_.get()),
                           static_cast<bool*>(in_rank_.get())};
    buffer_.get_layout(topk_idx(), layout_out_, HtStreams{stream()});
    got.rank_counts = download<int32_t>(TensorRef::vector(rank_counts_.get(), ScalarType::int32, R_), stream());
    got.expert_counts =
        download<int32_t>(TensorRef::vector(expert_counts_.get(), ScalarType::int32, o_.experts), stream());
    got.in_rank = download<uint8_t>(TensorRef::matrix(in_rank_.get(), ScalarType::boolean, o_.tokens, R_), stream());

    const HtDispatchResult bf16 = buffer_.dispatch(bf16_args(), HtStreams{stream()});
    got.bf16 = fetch(bf16);
    handle_ = bf16.handle;
    num_recv_ = bf16.num_rows;
    // The received rows are the combine input; copy them out: the next dispatch reuses the receive area.
    const std::size_t y_bytes = std::size_t(num_recv_) * o_.hidden * 2;
    y_ = device_alloc(y_bytes);
    check_cuda(cudaMemcpyAsync(y_.get(), bf16.recv_x.data, y_bytes, cudaMemcpyDeviceToDevice, stream()),
               "cudaMemcpyAsync");
    got.cached = fetch(buffer_.dispatch(cached_args(), HtStreams{stream()}));
    got.combined = download<uint16_t>(buffer_.combine(combine_args(), HtStreams{stream()}).x, stream());
    got.fp8 = fetch(buffer_.dispatch(fp8_args(), HtStreams{stream()}));
    team_.check_device_errors();
    return got;
  }

  // Runs dispatch BF16, combine (with that dispatch's handle) and dispatch FP8 once with the current
  // config; their received rows and combined rows must equal the checked pass's bit for bit (which equal
  // the reference's, hence the Checker's wording).
  bool check_again() {
    Checker check(me_, "HT");
    const std::string at = " (num_sms " + std::to_string(buffer_.config().num_sms) + ")";
    const HtDispatchResult bf16 = buffer_.dispatch(bf16_args(), HtStreams{stream()});
    check.equal("dispatch bf16 recv_x" + at, download<uint16_t>(bf16.recv_x, stream()), checked_.bf16.x_bf16,
                o_.hidden);
    HtCombineArgs combine = combine_args();
    if (bf16.num_rows == num_recv_) combine.handle = bf16.handle;  // else recv_x failed; combine all the same
    check.equal("combine x" + at, download<uint16_t>(buffer_.combine(combine, HtStreams{stream()}).x, stream()),
                checked_.combined, o_.hidden);
    const HtDispatchResult fp8 = buffer_.dispatch(fp8_args(), HtStreams{stream()});
    check.equal("dispatch fp8 recv_x" + at, download<uint8_t>(fp8.recv_x, stream()), checked_.fp8.x_fp8, o_.hidden);
    check.equal("dispatch fp8 recv_x_scales" + at, download<float>(fp8.recv_x_scales, stream()), checked_.fp8.scales,
                o_.hidden / ref::kFp8GroupSize);
    team_.check_device_errors();
    return check.ok();
  }

  Received fetch(const HtDispatchResult& r) const {
    Received got;
    got.num_recv_tokens = r.num_recv_tokens;
    got.num_rows = r.num_rows;
    if (r.recv_x.type == ScalarType::fp8_e4m3) {
      got.x_fp8 = download<uint8_t>(r.recv_x, stream());
      got.scales = download<float>(r.recv_x_scales, stream());
    } else {
      got.x_bf16 = download<uint16_t>(r.recv_x, stream());
    }
    got.src_idx = download<int32_t>(r.recv_src_idx, stream());
    got.topk_idx = download<int64_t>(r.recv_topk_idx, stream());
    got.weights = download<float>(r.recv_topk_weights, stream());
    got.expert_counts = download<int32_t>(r.num_recv_tokens_per_expert, stream());
    got.expert_counts_host = r.num_recv_tokens_per_expert_host;
    return got;
  }

  // ---- Byte accounting (per rank and direction) ----

  // Rows this rank sends over NVLink (every destination but itself) x (row payload + metadata:
  // src_idx, topk_idx int64 and weight per slot, FP8 scales).
  double dispatch_nvlink_bytes(bool fp8) const {
    int64_t remote_rows = 0;
    for (int d = 0; d < R_; ++d) remote_rows += d == me_ ? 0 : rows_to_rank_[d];
    const double scale_bytes = fp8 ? o_.hidden / 128 * 4.0 : 0.0;
    const double row = (fp8 ? 1.0 : 2.0) * o_.hidden + 4 + o_.topk * (8 + 4) + scale_bytes;
    return double(remote_rows) * row;
  }
  // DeepEP's convention: received rows (this rank's own included) x H x 2, FP8 scaled by (1 + 4/128)/2.
  double dispatch_algo_bytes(bool fp8) const {
    return double(num_recv_) * o_.hidden * 2.0 * (fp8 ? (1.0 + 4.0 / 128.0) / 2.0 : 1.0);
  }
  // Combine sends back every received row that came from another rank (BF16, no weights, no bias).
  double combine_nvlink_bytes() const { return double(num_recv_ - rows_to_rank_[me_]) * o_.hidden * 2.0; }

  Team& team_;
  const HtBenchOptions& o_;
  int R_, me_;
  Stream stream_;
  HtBuffer buffer_;
  Checker check_;
  std::size_t l2_flush_bytes_;  // before_call's flush: twice the L2
  DeviceMemory l2_flush_;
  DeviceMemory topk_idx_, weights_, x_bf16_, x_fp8_, scales_, y_;
  DeviceMemory rank_counts_, expert_counts_, in_rank_;
  HtLayout layout_out_;
  std::vector<int32_t> rows_to_rank_;       // this rank's tokens per destination rank (reference layout)
  std::shared_ptr<const HtHandle> handle_;  // of the checked BF16 dispatch: combine and cached dispatch use it
  int64_t num_recv_ = 0;                    // N of that dispatch
  Outputs checked_;                         // with o_.tune: the checked pass's outputs, for check_again()
};

// Every rank's measurements per row -> the slowest rank's row.
std::vector<HtBenchRow> gather(Team& team, cudaStream_t stream, const std::vector<Measured>& measured) {
  std::vector<RankTiming> mine;
  for (const Measured& m : measured) mine.push_back({m.timing, m.nvlink_bytes, m.algo_bytes});
  const std::vector<TeamTiming> timings = gather_timings(team, stream, mine);
  std::vector<HtBenchRow> rows;
  for (std::size_t i = 0; i < measured.size(); ++i) {
    HtBenchRow row;
    static_cast<TeamTiming&>(row) = timings[i];
    row.op = measured[i].op;
    row.dtype = measured[i].dtype;
    row.sms = measured[i].sms;
    row.checked = true;  // only reached when every rank's check passed
    rows.push_back(row);
  }
  return rows;
}

// The gathered rows of tune(), setting after setting -> one HtTuning per op and dtype.
std::vector<HtTuning> by_op(const std::vector<HtBenchRow>& rows) {
  std::vector<HtTuning> tuning;
  for (const HtBenchRow& row : rows) {
    auto t = std::find_if(tuning.begin(), tuning.end(),
                          [&](const HtTuning& u) { return u.op == row.op && u.dtype == row.dtype; });
    if (t == tuning.end()) t = tuning.insert(tuning.end(), HtTuning{row.op, row.dtype, {}, {}, 0});
    t->sms.push_back(row.sms);
    t->time_us.push_back(row.time_us);
  }
  for (HtTuning& t : tuning) {  // on a tie the fewer SMs: they leave more to overlapping compute
    t.best_sms = t.sms[std::min_element(t.time_us.begin(), t.time_us.end()) - t.time_us.begin()];
  }
  return tuning;
}

}  // namespace

void validate_ht_bench_options(const HtBenchOptions& o) {
  auto require = [](bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("HT bench: " + what);
  };
  require(o.tokens >= 1 && o.hidden >= 1 && o.topk >= 1 && o.experts >= 1,
          "--tokens, --hidden, --topk and --experts must be positive");
  require(o.topk <= o.experts, "--topk must be at most --experts (each token picks distinct experts)");
  require(o.num_sms >= 0, "--ht-sms must be >= 0 (0: the library's default)");
  require(o.repetitions >= 1 && o.tune_repetitions >= 1 && o.warmup >= 0, "repetitions must be >= 1");
}

HtBenchResult run_ht_bench(Team& team, const HtBenchOptions& options) {
  validate_ht_bench_options(options);
  const auto start = std::chrono::steady_clock::now();
  HtBench bench(team, options);
  require_every_rank(team, bench.stream(), bench.check(), "HT outputs differ from the CPU reference");
  if (team.rank() == 0) {
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    std::printf("HT: every rank's outputs equal the CPU reference (checked in %.1f s); timing...\n", took.count());
    std::fflush(stdout);
  }

  HtBenchResult result;
  result.ranks = team.size();
  result.tokens = options.tokens;
  result.hidden = options.hidden;
  result.topk = options.topk;
  result.experts = options.experts;
  result.repetitions = options.repetitions;
  result.buffer_bytes = bench.buffer_bytes();
  result.rows = gather(team, bench.stream(), bench.time_ops(options.repetitions, true));
  if (options.trace) bench.trace_calls();  // before tune(), which leaves the last num_sms it tried
  if (options.tune) {
    if (team.rank() == 0) {
      std::printf("HT: tuning num_sms (each setting checked against the outputs above)...\n");
      std::fflush(stdout);
    }
    result.tune_repetitions = options.tune_repetitions;
    result.tuning = by_op(gather(team, bench.stream(), bench.tune()));
  }
  return result;
}

}  // namespace epx::bench
