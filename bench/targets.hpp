// The issues' performance targets, by team size, for the default shapes only (HT: T=4096, LL: T=128;
// both H=7168, top-8 of 256 experts) on H200 over NVLink. The bench prints and writes them next to
// its measurements; nothing fails on a miss (targets live in the bench, never in a test).
//   EP=2: the HT issue (each with <= 16 SMs) and the LL issue, as times.
//   EP=8: the EP=4/8 issue: HT dispatch BF16 as algorithm bandwidth (DeepEP's convention), LL as times.
//   Other team sizes, or other shapes: none. And the LL buffer size the LL issue allows.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>

namespace epx::bench {

struct Target {
  double max_us = 0;         // at most this time; 0: no time target
  double min_algo_gbps = 0;  // at least this algorithm bandwidth; 0: no bandwidth target

  bool any() const { return max_us > 0 || min_algo_gbps > 0; }
  bool met(double time_us, double algo_gbps) const {  // time_us <= 0: not measured, so not met
    return (max_us <= 0 || (time_us > 0 && time_us <= max_us)) && (min_algo_gbps <= 0 || algo_gbps >= min_algo_gbps);
  }
  std::string text() const {  // "<= 190 us", ">= 340 GB/s", or "-"
    char out[32] = "-";
    if (max_us > 0) std::snprintf(out, sizeof out, "<= %.0f us", max_us);
    if (min_algo_gbps > 0) std::snprintf(out, sizeof out, ">= %.0f GB/s", min_algo_gbps);
    return out;
  }
};

inline Target ht_target(int ranks, bool default_shape, const std::string& op, const std::string& dtype) {
  if (!default_shape) return {};
  if (ranks == 2) {
    if (op == "layout") return {15, 0};
    if (op == "dispatch") return {dtype == "fp8" ? 105.0 : 190.0, 0};
    if (op == "combine" || op == "combine_zero_copy") return {190, 0};
  }
  if (ranks == 8 && op == "dispatch" && dtype == "bf16") return {0, 340};
  return {};
}

// The LL communication memory the LL issue allows per rank at the default shape (<= 64 MB, decimal: the
// stricter reading).
inline constexpr std::size_t kLlBufferTargetBytes = std::size_t(64) * 1000 * 1000;

inline Target ll_target(int ranks, bool default_shape, const std::string& op, const std::string& dtype,
                        const std::string& order) {
  if (!default_shape) return {};
  const bool dispatch_fp8 = op == "dispatch" && dtype == "fp8";
  const bool combine_local = op == "combine" && order == "local";
  if (ranks == 2 && dispatch_fp8) return {10, 0};
  if (ranks == 2 && combine_local) return {12, 0};
  if (ranks == 8 && dispatch_fp8) return {25, 0};
  if (ranks == 8 && combine_local) return {30, 0};
  return {};
}

}  // namespace epx::bench
