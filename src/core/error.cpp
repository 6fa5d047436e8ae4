#include "epx/error.hpp"

#include "core/rank_context.hpp"

namespace epx {

const char* to_string(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::invalid_argument:
      return "invalid argument";
    case ErrorKind::cuda:
      return "CUDA error";
    case ErrorKind::nccl:
      return "NCCL error";
    case ErrorKind::timeout:
      return "timeout";
    case ErrorKind::system:
      return "system error";
    case ErrorKind::internal:
      return "internal error";
  }
  return "error";
}

namespace {
std::string with_rank(int rank, const std::string& what) {
  if (rank < 0) return "epx: " + what;
  return "epx rank " + std::to_string(rank) + ": " + what;
}
}  // namespace

Error::Error(ErrorKind kind, int rank, const std::string& what)
    : std::runtime_error(with_rank(rank, what)), kind_(kind), rank_(rank) {}

namespace detail {

namespace {
thread_local int t_rank = -1;
}

int current_rank() { return t_rank; }

ScopedRank::ScopedRank(int rank) : previous_(t_rank) { t_rank = rank; }
ScopedRank::~ScopedRank() { t_rank = previous_; }

[[noreturn]] void fail(ErrorKind kind, const std::string& what) { throw Error(kind, t_rank, what); }

}  // namespace detail
}  // namespace epx
