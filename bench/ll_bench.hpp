// The low-latency (LL) benchmark: epx::LlBuffer's dispatch (FP8, BF16) and combine (local and naive
// order) on a decode shape, every op checked bit-exactly against the CPU reference once before it is
// timed (DESIGN.md §1.2, §1.3 and §3). Each op is one call captured in a CUDA graph and replayed. With
// `tune`, it then times dispatch FP8 and combine per LlConfig::num_sms.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "bench/kernel_clock.hpp"
#include "bench/team_timing.hpp"
#include "epx/team.hpp"

namespace epx::bench {

struct LlBenchOptions {
  int tokens = 128;    // T per rank, also T_max (LlBufferOptions::max_tokens_per_rank)
  int hidden = 7168;   // H
  int topk = 8;        // K
  int experts = 256;   // E
  int num_sms = 0;     // LlConfig::num_sms; 0: default_ll_config
  int warmup = 10;     // untimed graph replays per op; warmup and replays must be even (see ll_bench.cu)
  int replays = 100;   // timed graph replays per op (also per setting with `tune`)
  bool tune = false;   // also time dispatch FP8 and combine (local) per num_sms (kLlTuneSms)
  bool trace = false;  // then print dispatch's and combine's phase traces (a build with -DEPX_PHASE_TRACE=ON)
  uint64_t seed = 20261122;
};

// One timed op (TeamTiming: the slowest rank's median and bytes per direction).
struct LlBenchRow : TeamTiming {
  std::string op;        // dispatch, combine, dispatch_combine (one graph holding both)
  std::string dtype;     // dispatch: bf16 or fp8 (the payload on the wire); combine: bf16
  std::string order;     // combine's summation order (local or naive); empty for dispatch alone
  int sms = 0;           // LlConfig::num_sms
  bool checked = false;  // every rank's outputs equalled the CPU reference
  // The slowest rank's median time of one call when the graphs are replayed back to back (no barrier
  // between them, each launch overlapping the kernel before, as in a stream of calls): a round's time
  // divided by its replays.
  double in_a_row_us = 0;
  // The slowest rank's median time of one call inside a graph of kLlCallsPerGraph calls (each LL kernel a
  // programmatic dependent of the one before, as in a caller's decode graph), one replay after a team
  // barrier: a replay's time, by events around its launch, divided by its calls.
  double in_one_graph_us = 0;
  // The slowest rank's median time of one launch after a team barrier, as time_us, but with other code
  // run on every SM before the barrier (bench/other_code.cuh): the call's kernels fetch their code again,
  // as they do between the other kernels of a decode step.
  double cold_us = 0;
  // The slowest rank's median of the same launches as time_us, timed from the call's first kernel's start
  // to its last kernel's end on the GPU (CUPTI's activity records, as a profiler reports kernel time: no
  // graph launch or event in it). 0: not measured (no CUPTI on some rank; the send/receive step rows).
  double kernel_us = 0;
};

// Rounds of replays in a row per op (LlBenchRow::in_a_row_us).
inline constexpr int kLlInARowRounds = 5;
// Calls captured in one graph per op (LlBenchRow::in_one_graph_us): even, so that the calls alternate the
// buffer sets within it and every replay starts on the set the first call expects.
inline constexpr int kLlCallsPerGraph = 20;
static_assert(kLlCallsPerGraph % 2 == 0, "calls alternate the buffer sets");

// The num_sms values `tune` tries (those above the smallest SM count of any rank are left out).
inline constexpr int kLlTuneSms[] = {16, 24, 32, 48, 64, 96, 132};

struct LlTuning {
  int sms = 0;
  double dispatch_us = 0;  // dispatch FP8, the slowest rank's median
  double combine_us = 0;   // combine, local order
};

struct LlBenchResult {
  int ranks = 0, tokens = 0, hidden = 0, topk = 0, experts = 0;
  int replays = 0;
  std::size_t buffer_bytes = 0;  // LlBuffer::buffer_bytes() on this rank
  int message_header_bytes = 0;  // what each dispatch message carries besides its payload
  std::vector<LlBenchRow> rows;
  std::vector<LlTuning> tuning;  // empty unless options.tune
  int best_sms = 0;              // with tune: the setting of the smallest dispatch_us + combine_us
};

// Throws std::invalid_argument naming the first option out of range for a team of `ranks` (run_ll_bench
// checks too; the command checks before it measures anything).
void validate_ll_bench_options(const LlBenchOptions& options, int ranks);

// Collective over the team (one process per GPU); every rank returns the same gathered result. Throws
// (after every rank has printed what differed) when any rank's outputs differ from the reference.
// `kernel_clock` (open_kernel_clock's; may be null): the kernel time of each op too.
LlBenchResult run_ll_bench(Team& team, const LlBenchOptions& options, KernelClock* kernel_clock);

}  // namespace epx::bench
