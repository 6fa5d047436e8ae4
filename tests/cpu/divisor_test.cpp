#include "core/divisor.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

namespace {

using epx::core::Divisor;

// quotient and split against / and % for divisor d: every n near 0, near each multiple of d up to
// a bound, near 2^31, and random n below 2^31.
void expect_exact(uint32_t d, std::mt19937& random) {
  const Divisor div = Divisor::of(d);
  std::vector<uint32_t> ns;
  for (uint32_t n = 0; n < 4096; ++n) ns.push_back(n);
  for (uint64_t k = 1; k <= 64; ++k) {
    for (int64_t delta = -2; delta <= 2; ++delta) {
      const int64_t n = int64_t(k) * d + delta;
      if (n >= 0 && n < (int64_t(1) << 31)) ns.push_back(uint32_t(n));
    }
  }
  const uint32_t top = (uint32_t(1) << 31) - 1;
  for (uint32_t back = 0; back < 4096; ++back) ns.push_back(top - back);
  const int64_t last_multiple = int64_t(top) / d * d;
  for (int64_t delta = -2; delta <= 2; ++delta) {
    const int64_t n = last_multiple + delta;
    if (n >= 0 && n <= top) ns.push_back(uint32_t(n));
  }
  std::uniform_int_distribution<uint32_t> any(0, top);
  for (int i = 0; i < 2000; ++i) ns.push_back(any(random));
  for (const uint32_t n : ns) {
    ASSERT_EQ(div.quotient(n), n / d) << "n = " << n << ", d = " << d;
    const Divisor::Split split = div.split(n);
    ASSERT_EQ(split.quotient, n / d) << "n = " << n << ", d = " << d;
    ASSERT_EQ(split.remainder, n % d) << "n = " << n << ", d = " << d;
  }
}

TEST(Divisor, ExactForSmallDivisors) {
  std::mt19937 random(1);
  for (uint32_t d = 1; d <= 3000; ++d) expect_exact(d, random);
}

TEST(Divisor, ExactForPowersOfTwoAndTheirNeighbours) {
  std::mt19937 random(2);
  for (int l = 1; l <= 30; ++l) {
    const uint32_t p = uint32_t(1) << l;
    for (const uint32_t d : {p - 1, p, p + 1}) expect_exact(d, random);
  }
  expect_exact((uint32_t(1) << 31) - 1, random);
}

TEST(Divisor, ExactForRandomLargeDivisors) {
  std::mt19937 random(3);
  std::uniform_int_distribution<uint32_t> divisor(3001, (uint32_t(1) << 31) - 1);
  for (int i = 0; i < 500; ++i) expect_exact(divisor(random), random);
}

}  // namespace
