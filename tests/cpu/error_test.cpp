#include <gtest/gtest.h>

#include <string>

#include "core/rank_context.hpp"
#include "epx/error.hpp"

namespace epx {
namespace {

TEST(Error, MessageNamesTheRank) {
  const Error e(ErrorKind::cuda, 3, "cudaMalloc failed");
  EXPECT_STREQ(e.what(), "epx rank 3: cudaMalloc failed");
  EXPECT_EQ(e.rank(), 3);
  EXPECT_EQ(e.kind(), ErrorKind::cuda);
}

TEST(Error, WithoutARankSaysSo) {
  const Error e(ErrorKind::invalid_argument, -1, "bad");
  EXPECT_STREQ(e.what(), "epx: bad");
}

TEST(Error, FailUsesTheThreadsRank) {
  detail::ScopedRank outer(5);
  try {
    EPX_REQUIRE(false, "hidden size 100 is not a multiple of 128");
    FAIL() << "EPX_REQUIRE(false) did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.rank(), 5);
    EXPECT_EQ(e.kind(), ErrorKind::invalid_argument);
    EXPECT_STREQ(e.what(), "epx rank 5: hidden size 100 is not a multiple of 128");
  }
}

TEST(Error, ScopedRankRestoresThePreviousRank) {
  detail::ScopedRank outer(1);
  {
    detail::ScopedRank inner(2);
    EXPECT_EQ(detail::current_rank(), 2);
  }
  EXPECT_EQ(detail::current_rank(), 1);
}

TEST(Error, EveryKindHasAName) {
  for (ErrorKind kind : {ErrorKind::invalid_argument, ErrorKind::cuda, ErrorKind::nccl, ErrorKind::timeout,
                         ErrorKind::system, ErrorKind::internal}) {
    EXPECT_STRNE(to_string(kind), "error");
  }
}

}  // namespace
}  // namespace epx
