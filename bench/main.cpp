// epx-bench: measures epx on every local GPU (one process each, started by the bench itself) or as one
// rank of a torchrun-style job, next to the physical limits measured in the same run, and writes the
// JSON of DESIGN.md §3.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <optional>
#include <string>

#include "bench/ht_bench.hpp"
#include "bench/json_writer.hpp"
#include "bench/limits.hpp"
#include "bench/ll_bench.hpp"
#include "bench/targets.hpp"
#include "core/ll_areas.hpp"
#include "epx/version.hpp"
#include "launcher/launcher.hpp"

namespace epx::bench {
namespace {

struct Args {
  std::string json_path = "epx-bench.json";
  std::string device_kind;  // a name for the machine in the JSON, e.g. nvidia-h200-x2
  std::string commit;
  int timeout_ms = 5000;
  bool skip_ht = false;
  bool skip_ll = false;
  HtBenchOptions ht;
  LlBenchOptions ll;
};

void usage() {
  const HtBenchOptions ht;
  const LlBenchOptions ll;
  std::printf(
      "usage: epx-bench [--json FILE] [--device-kind NAME] [--commit SHA] [--timeout-ms N]\n"
      "                 [--skip-ht] [--ht-sms N] [--ht-tune] [--trace] [--tokens T]\n"
      "                 [--skip-ll] [--ll-sms N] [--ll-tune] [--ll-tokens T]\n"
      "                 [--hidden H] [--topk K] [--experts E]\n"
      "  Runs on every local GPU, one process each (or as one rank under torchrun-style RANK/WORLD_SIZE/\n"
      "  LOCAL_RANK/MASTER_ADDR/MASTER_PORT), measures the NVLink limits, then the HT and LL ops, each\n"
      "  checked against the CPU reference before it is timed, and writes FILE (default %s).\n"
      "  Shape (both modes): H %d, top-%d of %d experts, uniform routing.\n"
      "  HT: layout, dispatch BF16/FP8 and combine with T tokens per rank (--tokens, default %d);\n"
      "  --ht-sms: HtConfig::num_sms (default the library's). --ht-tune: then times dispatch BF16/FP8\n"
      "  and combine per num_sms (8..32, %d repetitions each), each setting's outputs compared with the\n"
      "  checked ones, and adds ht_tuning and ht_best_sms to FILE. --trace (a build with cmake\n"
      "  -DEPX_PHASE_TRACE=ON only): then prints the phase traces per rank (HT and LL dispatch and combine).\n"
      "  LL: dispatch FP8/BF16, combine (local and naive order; local_cw: local with the weights given to\n"
      "  combine, as DeepEP's API gives them) and dispatch + combine, T tokens per rank\n"
      "  (--ll-tokens, default %d; also the buffer's T_max), each one call captured in a CUDA graph and\n"
      "  replayed %d times (also in a row, and %d calls in one graph); --ll-sms: LlConfig::num_sms\n"
      "  (default the library's). --ll-tune: then times dispatch FP8 and combine (local) per num_sms\n"
      "  (16..132, up to the SM count), each setting checked again, and adds ll_tuning and ll_best_sms\n"
      "  to FILE. An HT option with --skip-ht (an LL one with --skip-ll) is an error.\n"
      "  Targets: the issues' (EP=2 and EP=8, default shapes only; bench/targets.hpp), printed and written\n"
      "  next to each result with whether it was met (HT: the time of one call; LL: a call's share of a\n"
      "  graph of %d, the issue's kernel time from events); a miss is reported, never an error.\n",
      Args{}.json_path.c_str(), ht.hidden, ht.topk, ht.experts, ht.tokens, ht.tune_repetitions, ll.tokens, ll.replays,
      kLlCallsPerGraph, kLlCallsPerGraph);
}

Args parse(int argc, char** argv) {
  Args args;
  if (const char* commit = std::getenv("EPX_COMMIT")) args.commit = commit;
  std::string ht_only, ll_only;  // the last option given that sets only the HT (LL) benchmark
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--ht-sms" || a == "--ht-tune" || a == "--tokens") ht_only = a;
    if (a == "--ll-sms" || a == "--ll-tune" || a == "--ll-tokens") ll_only = a;
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "epx-bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    auto number = [&]() {
      const std::string text = value();
      char* end = nullptr;
      const long n = std::strtol(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0' || n < 0 || n > (1L << 30)) {
        std::fprintf(stderr, "epx-bench: %s needs a non-negative whole number, got '%s'\n", a.c_str(), text.c_str());
        std::exit(2);
      }
      return int(n);
    };
    if (a == "--json")
      args.json_path = value();
    else if (a == "--device-kind")
      args.device_kind = value();
    else if (a == "--commit")
      args.commit = value();
    else if (a == "--timeout-ms")
      args.timeout_ms = number();
    else if (a == "--skip-ht")
      args.skip_ht = true;
    else if (a == "--ht-sms")
      args.ht.num_sms = number();
    else if (a == "--ht-tune")
      args.ht.tune = true;
    else if (a == "--trace")
      args.ht.trace = args.ll.trace = true;
    else if (a == "--tokens")
      args.ht.tokens = number();
    else if (a == "--skip-ll")
      args.skip_ll = true;
    else if (a == "--ll-sms")
      args.ll.num_sms = number();
    else if (a == "--ll-tune")
      args.ll.tune = true;
    else if (a == "--ll-tokens")
      args.ll.tokens = number();
    else if (a == "--hidden")
      args.ht.hidden = args.ll.hidden = number();
    else if (a == "--topk")
      args.ht.topk = args.ll.topk = number();
    else if (a == "--experts")
      args.ht.experts = args.ll.experts = number();
    else if (a == "--help" || a == "-h") {
      usage();
      std::exit(0);
    } else {
      std::fprintf(stderr, "epx-bench: unknown argument %s\n", a.c_str());
      usage();
      std::exit(2);
    }
  }
  // An option for a benchmark that is skipped would be silently ignored (--tokens with --skip-ht once ran
  // LL at its default T where T = 1 was meant).
  if (args.skip_ht && !ht_only.empty()) {
    std::fprintf(stderr, "epx-bench: %s sets the HT benchmark, which --skip-ht leaves out (LL's options: --ll-*)\n",
                 ht_only.c_str());
    std::exit(2);
  }
  if (args.skip_ll && !ll_only.empty()) {
    std::fprintf(stderr, "epx-bench: %s sets the LL benchmark, which --skip-ll leaves out\n", ll_only.c_str());
    std::exit(2);
  }
  if (args.skip_ht && args.skip_ll && args.ht.trace) {
    std::fprintf(stderr, "epx-bench: --trace traces HT and LL calls, which --skip-ht and --skip-ll leave out\n");
    std::exit(2);
  }
#ifndef EPX_PHASE_TRACE
  if (args.ht.trace) {
    std::fprintf(stderr, "epx-bench: --trace needs a build with cmake -DEPX_PHASE_TRACE=ON\n");
    std::exit(2);
  }
#endif
  return args;
}

std::string today() {
  char text[16];
  const std::time_t now = std::time(nullptr);
  std::strftime(text, sizeof text, "%Y-%m-%d", std::gmtime(&now));
  return text;
}

std::string device_description(int ranks) {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return "unknown";
  return std::to_string(ranks) + "x " + prop.name;
}

// The shape of a mode's run (HT and LL results alike).
template <typename Result>
void write_shape(JsonWriter& j, const Result& r) {
  j.field("ranks", r.ranks).field("tokens", r.tokens).field("hidden", r.hidden).field("topk", r.topk);
  j.field("experts", r.experts);
}

// The fields every timed row has (HT and LL rows alike), after time_us.
template <typename Row>
void write_timing(JsonWriter& j, const Row& row) {
  j.field("min_us", row.min_us).field("max_us", row.max_us).field("slowest_rank", row.slowest_rank);
  j.begin_array("median_us_per_rank");
  for (double us : row.median_us_per_rank) j.field(nullptr, us);
  j.end_array()
      .field("sms", row.sms)
      .field("nvlink_gbps", row.nvlink_gbps)
      .field("algo_gbps", row.algo_gbps)
      .field("nvlink_bytes", row.nvlink_bytes)
      .field("algo_bytes", row.algo_bytes)
      .field("checked", row.checked);
}

// Whether a run used the default shape of its mode (the targets are set for those shapes only).
template <typename Options, typename Result>
bool default_shape(const Result& r) {
  const Options d;
  return r.tokens == d.tokens && r.hidden == d.hidden && r.topk == d.topk && r.experts == d.experts;
}
bool default_shape(const HtBenchResult& r) { return default_shape<HtBenchOptions>(r); }
bool default_shape(const LlBenchResult& r) { return default_shape<LlBenchOptions>(r); }

// The time each mode's targets are set for: HT, time_us (one call after an L2 flush and a barrier); LL,
// in_one_graph_us, the LL issue's "kernel time from events over >= 100 graph replays" (the other LL columns
// carry a graph launch, or an event and a barrier, per call: an empty kernel timed as time_us takes ~4.4 us).
constexpr const char* kHtTargetTime = "time_us";
constexpr const char* kLlTargetTime = "in_one_graph_us";

// "target_us" and "target_algo_gbps" (null where there is none) and, where there is a target, "target_met"
// (`time_us`, the field named `time_field`, and the row's algorithm bandwidth against it) and
// "target_time" (that field's name).
void write_target(JsonWriter& j, const Target& t, const TeamTiming& row, double time_us, const char* time_field) {
  j.field("target_us", t.max_us > 0 ? t.max_us : std::nan(""))
      .field("target_algo_gbps", t.min_algo_gbps > 0 ? t.min_algo_gbps : std::nan(""));
  if (t.any()) j.field("target_met", t.met(time_us, row.algo_gbps)).field("target_time", time_field);
}

// The table's target column: the target and whether this run's `time_us` met it.
std::string target_cell(const Target& t, const TeamTiming& row, double time_us) {
  return t.any() ? t.text() + (t.met(time_us, row.algo_gbps) ? " met" : " missed") : "-";
}

void write_ht_rows(JsonWriter& j, const HtBenchResult& ht) {
  for (const HtBenchRow& row : ht.rows) {
    j.begin_object().field("mode", "ht").field("op", row.op).field("dtype", row.dtype);
    write_shape(j, ht);
    j.field("time_us", row.time_us);
    write_target(j, ht_target(ht.ranks, default_shape(ht), row.op, row.dtype), row, row.time_us, kHtTargetTime);
    write_timing(j, row);
    j.field("repetitions", ht.repetitions)
        .field("buffer_bytes", static_cast<long long>(ht.buffer_bytes))
        .field(
            "note",
            "time_us: the slowest rank's median (slowest_rank); min_us/max_us: over every rank's repetitions; "
            "each repetition after an L2 flush and a team barrier; bytes and GB/s: the slowest rank's, per direction")
        .end_object();
  }
}

// --ht-tune: "ht_tuning" [{op, dtype, sms, time_us}] and "ht_best_sms" {op_dtype: sms}.
void write_ht_tuning(JsonWriter& j, const HtBenchResult& ht) {
  j.begin_array("ht_tuning");
  for (const HtTuning& t : ht.tuning) {
    for (std::size_t i = 0; i < t.sms.size(); ++i) {
      j.begin_object()
          .field("op", t.op)
          .field("dtype", t.dtype)
          .field("sms", t.sms[i])
          .field("time_us", t.time_us[i])
          .end_object();
    }
  }
  j.end_array();
  j.begin_object("ht_best_sms");
  for (const HtTuning& t : ht.tuning) j.field((t.op + "_" + t.dtype).c_str(), t.best_sms);
  j.end_object();
}

// What a launch of the LL grid that only stores `bytes` of lines to the peer takes, timed as the LL calls
// (`time` = &LineBurst::us) or as kernel time (&LineBurst::kernel_us): the two line bursts of the limits
// joined by a straight line (the link's time per byte between them, extended past them); 0 where the
// limits have no bursts or the op moves nothing over NVLink.
double line_burst_us(const Limits& l, double bytes, double LineBurst::*time = &LineBurst::us) {
  const double a = l.line_bursts[0].*time, b = l.line_bursts[1].*time;
  const double a_bytes = double(l.line_bursts[0].bytes), b_bytes = double(l.line_bursts[1].bytes);
  if (a <= 0 || b <= 0 || bytes <= 0) return 0;
  return a + (bytes - a_bytes) * (b - a) / (b_bytes - a_bytes);
}

void write_ll_rows(JsonWriter& j, const LlBenchResult& ll, const Limits& l) {
  for (const LlBenchRow& row : ll.rows) {
    j.begin_object().field("mode", "ll").field("op", row.op).field("dtype", row.dtype);
    if (!row.order.empty()) j.field("order", row.order);
    write_shape(j, ll);
    j.field("time_us", row.time_us);
    write_target(j, ll_target(ll.ranks, default_shape(ll), row.op, row.dtype, row.order), row, row.in_one_graph_us,
                 kLlTargetTime);
    write_timing(j, row);
    j.field("in_a_row_us", row.in_a_row_us);
    j.field("in_one_graph_us", row.in_one_graph_us);
    j.field("cold_us", row.cold_us);
    j.field("kernel_us", row.kernel_us);
    j.field("line_burst_us", line_burst_us(l, row.nvlink_bytes));
    j.field("line_burst_kernel_us", line_burst_us(l, row.nvlink_bytes, &LineBurst::kernel_us));
    j.field("replays", ll.replays)
        .field("in_a_row_rounds", kLlInARowRounds)
        .field("calls_per_graph", kLlCallsPerGraph)
        .field("buffer_bytes", static_cast<long long>(ll.buffer_bytes))
        .field("message_header_bytes", ll.message_header_bytes)
        .field(
            "note",
            "time_us: the slowest rank's median (slowest_rank) of `replays` CUDA-graph replays, each one call "
            "(dispatch_combine: one of each) timed by events around its graph launch after a team barrier; two "
            "graphs of the call alternate the buffer sets; in_a_row_us: the slowest rank's median over "
            "`in_a_row_rounds` rounds, each "
            "after a team barrier, of `replays` replays back to back (a round's time / replays: each launch "
            "overlaps the kernel before, as in a stream of calls); in_one_graph_us: the slowest rank's median of "
            "`replays` replays, each after a team barrier, of one graph of `calls_per_graph` calls (the sets "
            "alternating within it), a replay's time by events / calls_per_graph (each LL kernel a programmatic "
            "dependent of the one before, as in a caller's decode graph; what target_met compares: target_time); "
            "cold_us: as time_us, with ~105 KB of other "
            "code run on every SM before each barrier (the call fetches its code again, as between a decode "
            "step's other kernels); kernel_us: the launches of time_us timed on the GPU by CUPTI's activity records, "
            "from the call's first kernel's start to its last kernel's end (the kernel time a profiler reports, "
            "as DeepEP's bench does; no graph launch or event in it), the slowest rank's median; 0: not measured; "
            "ops dispatch_send / dispatch_receive and combine_send / combine_receive: the "
            "two steps of a send_only call, each timed as time_us, the receive step after its sends and a barrier "
            "(every peer's data there: the step's cost without waiting; no in-a-row, cold or bytes); line_burst_us: "
            "a launch of the LL grid that only stores the op's NVLink bytes to the peer as lines, timed as "
            "time_us (the limits' two line bursts joined by a straight line; 0 without them); line_burst_kernel_us: "
            "that burst's kernel time, as kernel_us; no L2 flush "
            "(latency-bound); bytes and GB/s: the "
            "slowest rank's, per direction (NVLink: dispatch messages, payload as 128-byte lines of 112 row bytes + "
            "message_header_bytes each, or combine rows back to the home rank as 128-byte lines of 124 row bytes)")
        .end_object();
  }
}

// --ll-tune: "ll_tuning" [{sms, dispatch_us, combine_us}] (dispatch FP8, combine local order) and
// "ll_best_sms" (the smallest sum).
void write_ll_tuning(JsonWriter& j, const LlBenchResult& ll) {
  j.begin_array("ll_tuning");
  for (const LlTuning& t : ll.tuning) {
    j.begin_object().field("sms", t.sms).field("dispatch_us", t.dispatch_us).field("combine_us", t.combine_us);
    j.end_object();
  }
  j.end_array();
  j.field("ll_best_sms", ll.best_sms);
}

void write_json(const Args& args, int ranks, const Limits& limits, const HtBenchResult* ht, const LlBenchResult* ll) {
  JsonWriter j;
  j.begin_object()
      .field("device", args.device_kind.empty() ? device_description(ranks) : args.device_kind)
      .field("date", today())
      .field("commit", args.commit.empty() ? std::string("unknown") : args.commit)
      .field("epx_version", EPX_VERSION_STRING)
      .field("ranks", ranks);
  j.begin_object("limits")
      .field("nvlink_measured", limits.measured_nvlink)
      .field("nvlink_sm_store_gbps", limits.nvlink_sm_store_gbps)
      .field("nvlink_sm_store_blocks", limits.nvlink_sm_store_blocks)
      .field("nvlink_sm_store_16_blocks_gbps", limits.nvlink_sm_store_16_blocks_gbps)
      .field("nvlink_copy_engine_gbps", limits.nvlink_copy_engine_gbps)
      .field("nvlink_pull_gbps", limits.nvlink_pull_gbps)
      .field("nvlink_pull_16_blocks_gbps", limits.nvlink_pull_16_blocks_gbps)
      .field("nvlink_pull_16_blocks_beside_copy_engine_gbps", limits.nvlink_pull_16_blocks_beside_copy_engine_gbps)
      .field("flag_latency_us", limits.flag_latency_us)
      .field("relaxed_word_latency_us", limits.relaxed_word_latency_us)
      .field("one_kernel_in_one_graph_us", limits.one_kernel_in_one_graph_us)
      .field("one_kernel_graph_us", limits.one_kernel_graph_us)
      .field("one_kernel_graph_in_a_row_us", limits.one_kernel_graph_in_a_row_us)
      .field("one_kernel_graph_kernel_us", limits.one_kernel_graph_kernel_us)
      .field("hbm_copy_gbps", limits.hbm_copy_gbps)
      .field("data_checked", limits.data_checked)
      .field("load_private_relaxed_sys_ns", limits.load_private_ns.relaxed_sys)
      .field("load_private_volatile_ns", limits.load_private_ns.volatile_load)
      .field("load_own_symmetric_relaxed_sys_ns", limits.load_own_symmetric_ns.relaxed_sys)
      .field("load_own_symmetric_volatile_ns", limits.load_own_symmetric_ns.volatile_load)
      .field("load_peer_symmetric_relaxed_sys_ns", limits.load_peer_symmetric_ns.relaxed_sys)
      .field("load_peer_symmetric_volatile_ns", limits.load_peer_symmetric_ns.volatile_load);
  const auto write_stamps = [&](const std::string& prefix, const StampProbe& p) {
    j.field((prefix + "lines").c_str(), static_cast<long long>(p.lines))
        .field((prefix + "16_bytes_torn").c_str(), static_cast<long long>(p.torn_16))
        .field((prefix + "16_bytes_missing").c_str(), static_cast<long long>(p.missing_16))
        .field((prefix + "128_bytes_torn").c_str(), static_cast<long long>(p.torn_128))
        .field((prefix + "128_bytes_missing").c_str(), static_cast<long long>(p.missing_128))
        .field((prefix + "bulk_torn").c_str(), static_cast<long long>(p.torn_bulk))
        .field((prefix + "bulk_missing").c_str(), static_cast<long long>(p.missing_bulk));
  };
  write_stamps("stamped_", limits.stamps);
  write_stamps("stamped_same_gpu_", limits.stamps_same_gpu);
  write_stamps("stamped_pulled_", limits.stamps_pulled);
  for (const LineBurst& b : limits.line_bursts) {
    j.field(("line_burst_" + std::to_string(b.bytes >> 20) + "_mib_us").c_str(), b.us);
    j.field(("line_pull_" + std::to_string(b.bytes >> 20) + "_mib_us").c_str(), b.pull_us);
    j.field(("line_burst_" + std::to_string(b.bytes >> 20) + "_mib_kernel_us").c_str(), b.kernel_us);
  }
  j.field("handshake_us", limits.handshake.us)
      .field("handshake_wait_rank0_us", limits.handshake.wait_us[0])
      .field("handshake_wait_rank1_us", limits.handshake.wait_us[1])
      .field("handshake_start_skew_us", limits.handshake.start_skew_us);
  j.end_object();
  j.begin_array("results");
  if (ht != nullptr) write_ht_rows(j, *ht);
  if (ll != nullptr) write_ll_rows(j, *ll, limits);
  j.end_array();
  if (ht != nullptr && !ht->tuning.empty()) write_ht_tuning(j, *ht);
  if (ll != nullptr && !ll->tuning.empty()) write_ll_tuning(j, *ll);
  j.end_object();
  std::ofstream out(args.json_path);
  out << j.str() << "\n";
  if (!out) {
    std::fprintf(stderr, "epx-bench: cannot write %s\n", args.json_path.c_str());
    std::exit(1);
  }
}

std::string formatted(double value, const char* format) {
  char text[32];
  std::snprintf(text, sizeof text, format, value);
  return text;
}

std::string number_or_dash(double value, const char* format) { return value <= 0 ? "-" : formatted(value, format); }

void print_ht_table(const HtBenchResult& ht) {
  std::printf("\nHT, %d rank(s): %d tokens per rank, hidden %d, top-%d of %d experts, buffer %.1f MiB per rank\n",
              ht.ranks, ht.tokens, ht.hidden, ht.topk, ht.experts, double(ht.buffer_bytes) / (1 << 20));
  std::printf("time: the slowest rank's median of %d repetitions; GB/s per rank and direction\n", ht.repetitions);
  std::printf("%-16s %-6s %9s %12s %10s %5s %8s  %s\n", "op", "dtype", "time us", "NVLink GB/s", "algo GB/s", "SMs",
              "checked", "target");
  for (const HtBenchRow& row : ht.rows) {
    const Target target = ht_target(ht.ranks, default_shape(ht), row.op, row.dtype);
    std::printf("%-16s %-6s %9.1f %12s %10s %5s %8s  %s\n", row.op.c_str(), row.dtype.c_str(), row.time_us,
                number_or_dash(row.nvlink_gbps, "%.1f").c_str(), number_or_dash(row.algo_gbps, "%.1f").c_str(),
                number_or_dash(row.sms, "%.0f").c_str(), row.checked ? "yes" : "NO",
                target_cell(target, row, row.time_us).c_str());
  }
}

void print_ht_tuning(const HtBenchResult& ht) {
  std::printf("\nHT tuning: op x num_sms -> slowest-rank median us (%d repetitions each; * the best per op)\n",
              ht.tune_repetitions);
  std::printf("%-16s %-6s", "op", "dtype");
  for (int sms : ht.tuning.front().sms) std::printf(" %9d", sms);
  for (const HtTuning& t : ht.tuning) {
    std::printf("\n%-16s %-6s", t.op.c_str(), t.dtype.c_str());
    for (std::size_t i = 0; i < t.sms.size(); ++i) {
      std::printf(" %8.1f%c", t.time_us[i], t.sms[i] == t.best_sms ? '*' : ' ');
    }
  }
  std::printf("\n");
}

// LL times next to the latency floor measured above: "x flag" is time_us / the one-way flag latency.
void print_ll_table(const LlBenchResult& ll, const Limits& l) {
  const double mib = double(ll.buffer_bytes) / (1 << 20);
  std::printf("\nLL, %d rank(s): %d tokens per rank (= T_max), hidden %d, top-%d of %d experts, %d SMs\n", ll.ranks,
              ll.tokens, ll.hidden, ll.topk, ll.experts, ll.rows.empty() ? 0 : ll.rows.front().sms);
  std::printf(
      "LL buffer %.1f MiB per rank (target <= %zu MB: %s); one-way flag latency %s us; timed as these calls: a "
      "graph of one empty kernel %.2f us (in a row %.2f us; %.2f us each in one graph), a launch storing "
      "1 / 2 MiB of lines to the peer %s / %s us, a launch waiting for a word from the peer %s us (the ranks' start "
      "skew %s us)\n",
      mib, kLlBufferTargetBytes / 1000000, ll.buffer_bytes <= kLlBufferTargetBytes ? "met" : "MISSED",
      number_or_dash(l.flag_latency_us, "%.2f").c_str(), l.one_kernel_graph_us, l.one_kernel_graph_in_a_row_us,
      l.one_kernel_in_one_graph_us, number_or_dash(l.line_bursts[0].us, "%.2f").c_str(),
      number_or_dash(l.line_bursts[1].us, "%.2f").c_str(), number_or_dash(l.handshake.us, "%.2f").c_str(),
      l.measured_nvlink ? formatted(l.handshake.start_skew_us, "%.2f").c_str() : "-");
  std::printf(
      "time: the slowest rank's median of %d graph replays (one call each, after a team barrier); in a row: one call "
      "of %d replays back to back; 1 graph: one call of a graph of %d, replayed as time (its floor: "
      "an empty kernel timed so, above); cold: as time, with other code run on every SM before "
      "each barrier; burst: a launch that only stores the call's NVLink bytes to the peer as lines, timed as time "
      "(from the two bursts "
      "above); kernel: the launches of time, from the call's first kernel's start to its last kernel's end on the GPU "
      "(CUPTI), as a profiler reports kernel time; burst kernel: the burst's kernel time; *_send and *_receive: a "
      "send_only call's two steps, each timed alone (the receive step with its data "
      "there); target: against 1 graph (the issue's kernel time from events); GB/s per rank and direction\n",
      ll.replays, ll.replays, kLlCallsPerGraph);
  std::printf("%-16s %-6s %-8s %9s %7s %9s %8s %8s %9s %8s %13s %12s %10s %8s  %s\n", "op", "dtype", "order", "time us",
              "x flag", "in a row", "1 graph", "cold", "burst us", "kernel", "burst kernel", "NVLink GB/s", "algo GB/s",
              "checked", "target");
  for (const LlBenchRow& row : ll.rows) {
    const Target target = ll_target(ll.ranks, default_shape(ll), row.op, row.dtype, row.order);
    std::printf("%-16s %-6s %-8s %9.2f %7s %9s %8s %8s %9s %8s %13s %12s %10s %8s  %s\n", row.op.c_str(),
                row.dtype.c_str(), row.order.empty() ? "-" : row.order.c_str(), row.time_us,
                number_or_dash(l.flag_latency_us > 0 ? row.time_us / l.flag_latency_us : 0, "%.1f").c_str(),
                number_or_dash(row.in_a_row_us, "%.2f").c_str(), number_or_dash(row.in_one_graph_us, "%.2f").c_str(),
                number_or_dash(row.cold_us, "%.2f").c_str(),
                number_or_dash(line_burst_us(l, row.nvlink_bytes), "%.2f").c_str(),
                number_or_dash(row.kernel_us, "%.2f").c_str(),
                number_or_dash(line_burst_us(l, row.nvlink_bytes, &LineBurst::kernel_us), "%.2f").c_str(),
                number_or_dash(row.nvlink_gbps, "%.1f").c_str(), number_or_dash(row.algo_gbps, "%.1f").c_str(),
                row.checked ? "yes" : "NO", target_cell(target, row, row.in_one_graph_us).c_str());
  }
}

void print_ll_tuning(const LlBenchResult& ll) {
  std::printf("\nLL tuning: num_sms -> slowest-rank median us (%d replays each; * the best sum)\n", ll.replays);
  std::printf("%-6s %12s %12s %10s\n", "SMs", "dispatch fp8", "combine", "sum");
  for (const LlTuning& t : ll.tuning) {
    std::printf("%-6d %12.2f %12.2f %9.2f%c\n", t.sms, t.dispatch_us, t.combine_us, t.dispatch_us + t.combine_us,
                t.sms == ll.best_sms ? '*' : ' ');
  }
}

void print_stamps(const std::string& where, const StampProbe& p) {
  std::printf("%-44s %lld torn, %lld missing of %lld\n", ("stamped 16-byte stores" + where).c_str(),
              (long long)p.torn_16, (long long)p.missing_16, (long long)(p.lines * 8));
  std::printf("%-44s %lld torn vectors, %lld missing of %lld\n", ("stamped 128-byte lines" + where).c_str(),
              (long long)p.torn_128, (long long)p.missing_128, (long long)p.lines);
  std::printf("%-44s %lld torn vectors, %lld missing of %lld\n", ("stamped lines by bulk copy" + where).c_str(),
              (long long)p.torn_bulk, (long long)p.missing_bulk, (long long)p.lines);
}

void print_table(int ranks, const Limits& l, const HtBenchResult* ht, const LlBenchResult* ll) {
  std::printf("\nepx-bench, %d rank(s)\n", ranks);
  std::printf("%-44s %12s\n", "limit", "value");
  if (l.measured_nvlink) {
    std::printf("%-44s %9.1f GB/s\n",
                ("NVLink SM stores, per direction (" + std::to_string(l.nvlink_sm_store_blocks) + " CTAs)").c_str(),
                l.nvlink_sm_store_gbps);
    std::printf("%-44s %9.1f GB/s\n", "NVLink SM stores, per direction (16 CTAs)", l.nvlink_sm_store_16_blocks_gbps);
    std::printf("%-44s %9.1f GB/s\n", "NVLink copy engine, per direction", l.nvlink_copy_engine_gbps);
    std::printf("%-44s %9.1f GB/s\n",
                ("NVLink pulled by bulk loads (" + std::to_string(l.nvlink_sm_store_blocks) + " CTAs)").c_str(),
                l.nvlink_pull_gbps);
    std::printf("%-44s %9.1f GB/s\n", "NVLink pulled by bulk loads (16 CTAs)", l.nvlink_pull_16_blocks_gbps);
    std::printf("%-44s %9.1f GB/s\n", "  pull (16 CTAs) beside the copy engine",
                l.nvlink_pull_16_blocks_beside_copy_engine_gbps);
    for (const LineBurst& b : l.line_bursts) {
      std::printf("%-44s %9.2f us\n",
                  (std::to_string(b.bytes >> 20) + " MiB of lines to the next rank, as LL calls").c_str(), b.us);
      std::printf("%-44s %9.2f us\n",
                  (std::to_string(b.bytes >> 20) + " MiB pulled from the next rank, as LL calls").c_str(), b.pull_us);
      std::printf("%-44s %9s us\n", ("  the first's kernel time (" + std::to_string(b.bytes >> 20) + " MiB)").c_str(),
                  number_or_dash(b.kernel_us, "%.2f").c_str());
    }
    std::printf("%-44s %9.2f us\n", "flag latency, one way", l.flag_latency_us);
    std::printf("%-44s %9.2f us\n", "  with relaxed stores", l.relaxed_word_latency_us);
    std::printf("%-44s %9.2f us\n", "a word from the previous rank, as LL calls", l.handshake.us);
    std::printf("%-44s %5.2f / %.2f us\n", "  its wait on rank 0 / rank 1 (medians)", l.handshake.wait_us[0],
                l.handshake.wait_us[1]);
    std::printf("%-44s %9.2f us\n", "  start skew after the barrier (median)", l.handshake.start_skew_us);
    std::printf("%-44s %12s\n", "NVLink data checked", l.data_checked ? "yes" : "NO");
    const auto print_load = [](const char* where, const LoadRoundTrip& t) {
      std::printf("%-44s %5.0f / %.0f ns\n", (std::string("load round trip, ") + where).c_str(), t.relaxed_sys,
                  t.volatile_load);
    };
    std::printf("(dependent 8-byte loads, one thread: ld.relaxed.sys / ld.volatile)\n");
    print_load("private memory", l.load_private_ns);
    print_load("own symmetric memory", l.load_own_symmetric_ns);
    print_load("next rank's symmetric memory", l.load_peer_symmetric_ns);
    print_stamps("", l.stamps);
    print_stamps(" (pulled)", l.stamps_pulled);
  } else {
    std::printf("%-44s %12s\n", "NVLink limits", "n/a: 1 GPU");
  }
  if (l.stamps_same_gpu.lines > 0) print_stamps(" (same GPU)", l.stamps_same_gpu);
  std::printf("%-44s %9.2f us\n", "graph of one empty kernel, timed as LL calls", l.one_kernel_graph_us);
  std::printf("%-44s %9.2f us\n", "the same, timed as LL calls in a row", l.one_kernel_graph_in_a_row_us);
  std::printf("%-44s %9s us\n", "  its kernel time", number_or_dash(l.one_kernel_graph_kernel_us, "%.2f").c_str());
  std::printf("%-44s %9.2f us\n", "an empty kernel, timed as LL calls in one graph", l.one_kernel_in_one_graph_us);
  std::printf("%-44s %9.1f GB/s\n", "HBM device-to-device copy (read + write)", l.hbm_copy_gbps);
  if (ht != nullptr) {
    print_ht_table(*ht);
    if (!ht->tuning.empty()) print_ht_tuning(*ht);
  } else {
    std::printf("\n(HT benchmark skipped: --skip-ht)\n");
  }
  if (ll != nullptr) {
    print_ll_table(*ll, l);
    if (!ll->tuning.empty()) print_ll_tuning(*ll);
  } else {
    std::printf("\n(LL benchmark skipped: --skip-ll)\n");
  }
}

int run(int argc, char** argv) {
  const Args args = parse(argc, argv);
  const launch::Start start = launch::start(argc, argv);
  if (start.role == launch::Role::launcher) return start.exit_code;
  if (start.role == launch::Role::no_gpu) {
    std::printf(
        "epx-bench: no GPU is visible on this machine, so nothing was measured.\n"
        "Run it on a machine with NVIDIA Hopper GPUs (all local GPUs are used, one process each).\n");
    return 2;
  }
  TeamOptions options;
  options.wait_timeout = std::chrono::milliseconds(args.timeout_ms);
  auto team = launch::make_team(start.rank, options);
  // Options out of range are refused before anything is measured.
  if (!args.skip_ht) validate_ht_bench_options(args.ht);
  if (!args.skip_ll) validate_ll_bench_options(args.ll, team->size());
  std::string no_kernel_clock;
  const std::unique_ptr<KernelClock> kernel_clock = open_kernel_clock(*team, no_kernel_clock);
  if (kernel_clock == nullptr && team->rank() == 0) {
    std::printf("epx-bench: no kernel time (%s)\n", no_kernel_clock.c_str());
  }
  const Limits limits = measure_limits(*team, kernel_clock.get());
  std::optional<HtBenchResult> ht;
  if (!args.skip_ht) ht = run_ht_bench(*team, args.ht);
  std::optional<LlBenchResult> ll;
  if (!args.skip_ll) ll = run_ll_bench(*team, args.ll, kernel_clock.get());
  if (team->rank() == 0) {
    print_table(team->size(), limits, ht ? &*ht : nullptr, ll ? &*ll : nullptr);
    write_json(args, team->size(), limits, ht ? &*ht : nullptr, ll ? &*ll : nullptr);
    std::printf("wrote %s\n", args.json_path.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace epx::bench

int main(int argc, char** argv) {
  try {
    return epx::bench::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "epx-bench: %s\n", e.what());
    return 1;
  }
}
