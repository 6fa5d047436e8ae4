// The rank that errors raised on this host thread are attributed to.
//
// One process usually drives one rank, but the single-GPU multi-rank mode drives several ranks from
// several threads of one process, so the rank is per thread. Team methods set it on entry.
#pragma once

#include <string>

#include "epx/error.hpp"

namespace epx::detail {

int current_rank();

// Sets the calling thread's rank for its lifetime, restoring the previous one after.
class ScopedRank {
 public:
  explicit ScopedRank(int rank);
  ~ScopedRank();
  ScopedRank(const ScopedRank&) = delete;
  ScopedRank& operator=(const ScopedRank&) = delete;

 private:
  int previous_;
};

// Throws epx::Error naming the calling thread's rank.
[[noreturn]] void fail(ErrorKind kind, const std::string& what);

}  // namespace epx::detail

// Argument checks: EPX_REQUIRE(cond, "what the caller got wrong" + details). A macro, so that the
// message is only built when the check fails: the checks run on every dispatch and combine call, and
// most messages are made of several strings and numbers.
#define EPX_REQUIRE(condition, message)                                                 \
  do {                                                                                  \
    if (!(condition)) ::epx::detail::fail(::epx::ErrorKind::invalid_argument, message); \
  } while (0)
