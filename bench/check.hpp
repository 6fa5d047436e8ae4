// Bit-exact comparison of GPU outputs with the CPU reference, and the team-wide verdict: what every
// bench part does before it times anything.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "bench/team_sync.hpp"
#include "epx/team.hpp"

namespace epx::bench {

template <class T>
std::string show(T value) {
  unsigned long long bits = 0;
  std::memcpy(&bits, &value, sizeof value);
  char text[64];
  if constexpr (std::is_floating_point_v<T>) {
    std::snprintf(text, sizeof text, "%g (bits 0x%llx)", double(value), bits);
  } else {
    std::snprintf(text, sizeof text, "%lld (0x%llx)", static_cast<long long>(value), bits);
  }
  return text;
}

// Compares GPU outputs with the reference bit for bit; says on stderr what differed, naming the rank
// and the bench part (`mode`, e.g. "HT").
class Checker {
 public:
  Checker(int rank, const char* mode) : rank_(rank), mode_(mode) {}
  bool ok() const { return ok_; }

  void fail(const std::string& what) {
    std::fprintf(stderr, "epx-bench rank %d: %s %s\n", rank_, mode_, what.c_str());
    ok_ = false;
  }

  // `cols` only locates the first difference as [row][col].
  template <class T>
  void equal(const std::string& what, const std::vector<T>& got, const std::vector<T>& want, int64_t cols = 1) {
    if (got.size() != want.size()) {
      fail(what + ": " + std::to_string(got.size()) + " elements, the reference has " + std::to_string(want.size()));
      return;
    }
    if (got.empty() || std::memcmp(got.data(), want.data(), got.size() * sizeof(T)) == 0) return;
    std::size_t bad = 0, first = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0 && bad++ == 0) first = i;
    }
    const std::size_t c = std::size_t(std::max<int64_t>(cols, 1));
    fail(what + " differs from the CPU reference in " + std::to_string(bad) + " of " + std::to_string(got.size()) +
         " elements; first at [" + std::to_string(first / c) + "][" + std::to_string(first % c) + "]: got " +
         show(got[first]) + ", want " + show(want[first]));
  }

 private:
  int rank_;
  const char* mode_;
  bool ok_ = true;
};

// Collective: throws on every rank, naming the failed ones, unless every rank's `ok` holds.
inline void require_every_rank(Team& team, cudaStream_t stream, bool ok, const std::string& what) {
  const std::vector<double> passed = all_gather(team, stream, {ok ? 1.0 : 0.0});
  std::string failed;
  for (int r = 0; r < team.size(); ++r) {
    if (passed[r] == 0.0) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
  }
  if (!failed.empty()) throw std::runtime_error(what + " on rank(s) " + failed + " (details above)");
}

}  // namespace epx::bench
