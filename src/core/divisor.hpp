// Division by a divisor fixed on the host. The device's integer division by a run-time value is a
// reciprocal estimate and a correction: ~20 dependent instructions, which the LL kernels would pay on
// their critical paths for every work item (a warp there runs its instructions one after another, so
// their latencies add up). Divisor::of finds a multiplier once; quotient() is then one 32 x 32 -> 64-bit
// multiply and a shift (constexpr: host and device code, the kernels with --expt-relaxed-constexpr).
//
// Why it is exact for every 0 <= n < 2^31 and 1 <= d < 2^31: with l = ceil(log2 d), p = 31 + l and
// m = ceil(2^p / d) = (2^p + e) / d for some 0 <= e < d,
//   floor(n m / 2^p) = floor(n / d + n e / (d 2^p)), where n e / (d 2^p) < 2^31 / 2^p = 2^-l <= 1 / d,
// and n / d is at most (d - 1) / d above an integer, so adding less than 1 / d does not reach the next
// one. m < 2^32: d is a power of two (m = 2^31), or d >= 2^(l - 1) + 1, so 2^p / d <= 2^32 / (1 + 2^(1 - l)),
// at most 2^32 - 4 for l <= 31, and its ceiling stays below 2^32. p <= 62.
#pragma once

#include <cstdint>

namespace epx::core {

struct Divisor {
  uint32_t d = 1;
  uint32_t multiplier = 1;  // m above (d = 1: p = 0, m = 1)
  uint32_t shift = 0;       // p above

  // d in [1, 2^31) (0 divides by zero here).
  static constexpr Divisor of(uint32_t d) {
    int l = 0;
    while ((uint64_t(1) << l) < d) ++l;
    const uint32_t p = d == 1 ? 0 : 31 + l;
    const uint64_t m = d == 1 ? 1 : ((uint64_t(1) << p) + d - 1) / d;
    return Divisor{d, uint32_t(m), p};
  }

  struct Split {
    uint32_t quotient, remainder;
  };

  // n / d for 0 <= n < 2^31.
  constexpr uint32_t quotient(uint32_t n) const { return uint32_t((uint64_t(n) * multiplier) >> shift); }
  // n / d and n % d for 0 <= n < 2^31.
  constexpr Split split(uint32_t n) const {
    const uint32_t q = quotient(n);
    return Split{q, n - q * d};
  }
};

}  // namespace epx::core
