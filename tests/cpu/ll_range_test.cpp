// LlRange is read by DeepEP-compatible callers as one little-endian int64 (DeepEP's layout_range):
// count in the low 32 bits, begin in the high 32. The C struct must agree.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "epx/epx.h"
#include "epx/ll.hpp"

namespace {

template <typename Range>
int64_t as_int64(const Range& range) {
  static_assert(sizeof(Range) == sizeof(int64_t));
  int64_t word = 0;
  std::memcpy(&word, &range, sizeof(word));
  return word;
}

TEST(LlRange, ReadsAsDeepEpsLayoutRange) {
  epx::LlRange range;
  range.count = 3;
  range.begin = 70000;
  EXPECT_EQ(as_int64(range) & 0xFFFFFFFF, 3);
  EXPECT_EQ(as_int64(range) >> 32, 70000);

  epx_ll_range c_range{};
  c_range.count = 3;
  c_range.begin = 70000;
  EXPECT_EQ(as_int64(c_range), as_int64(range));
}

}  // namespace
