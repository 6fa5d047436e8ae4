// The high-throughput (HT) benchmark: epx::HtBuffer's layout, dispatch (BF16, FP8, cached BF16) and
// combine on a DeepSeek-V3-like shape, every op checked bit-exactly against the CPU reference once
// before it is timed (DESIGN.md §1.1 and §3). With `tune`, it then times the send kernels' ops per
// HtConfig::num_sms, the measurements default_ht_config cites.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "bench/team_timing.hpp"
#include "epx/team.hpp"

namespace epx::bench {

struct HtBenchOptions {
  int tokens = 4096;  // T per rank
  int hidden = 7168;  // H
  int topk = 8;       // K
  int experts = 256;  // E
  int num_sms = 0;    // HtConfig::num_sms; 0: default_ht_config(R)
  int warmup = 10;
  int repetitions = 100;  // timed, per op
  bool tune = false;      // also time dispatch BF16/FP8 and combine per num_sms (kHtTuneSms)
  bool trace = false;     // then print the dispatch's phase trace (a build with -DEPX_PHASE_TRACE=ON)
  int tune_repetitions = 30;
  uint64_t seed = 20261122;
};

// One timed op. Times are the slowest rank's: time_us is the largest per-rank median; min/max are over
// every rank's repetitions. Bytes (per rank and direction) and GB/s are the slowest rank's too.
struct HtBenchRow : TeamTiming {
  std::string op;        // layout, dispatch, dispatch_cached, combine
  std::string dtype;     // bf16 or fp8 (x's type); int64 for layout (it reads only topk_idx)
  int sms = 0;           // HtConfig::num_sms of the send kernels; 0 for layout (its grid is fixed)
  bool checked = false;  // every rank's outputs equalled the CPU reference
};

// The num_sms values `tune` tries (those above the smallest SM count of any rank are left out).
inline constexpr int kHtTuneSms[] = {8, 12, 16, 20, 24, 32};

// One op timed per num_sms by `tune`, each setting's outputs first compared with the checked pass's.
struct HtTuning {
  std::string op, dtype;        // dispatch bf16, dispatch fp8, combine bf16
  std::vector<int> sms;         // the settings tried, ascending
  std::vector<double> time_us;  // per setting: the slowest rank's median
  int best_sms = 0;             // the setting of the smallest time_us
};

struct HtBenchResult {
  int ranks = 0, tokens = 0, hidden = 0, topk = 0, experts = 0;
  int repetitions = 0;
  std::size_t buffer_bytes = 0;  // HtBuffer::buffer_bytes() on this rank
  std::vector<HtBenchRow> rows;
  int tune_repetitions = 0;
  std::vector<HtTuning> tuning;  // empty unless options.tune
};

// Throws std::invalid_argument naming the first option out of range (run_ht_bench checks too; the
// command checks before it measures anything).
void validate_ht_bench_options(const HtBenchOptions& options);

// Collective over the team (one process per GPU); every rank returns the same gathered result. Throws
// (after every rank has printed what differed) when any rank's outputs differ from the reference.
HtBenchResult run_ht_bench(Team& team, const HtBenchOptions& options);

}  // namespace epx::bench
