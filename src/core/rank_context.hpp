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

// Argument checks: `require(cond, "what the caller got wrong")`.
inline void require(bool condition, const std::string& message) {
  if (!condition) fail(ErrorKind::invalid_argument, message);
}

}  // namespace epx::detail
