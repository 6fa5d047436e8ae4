// epx — the one error type of the library.
//
// Every failure the library detects (a bad argument, a failed CUDA or NCCL call, a device wait that
// timed out) is thrown as epx::Error. Its message always starts with the rank that saw it, so that
// in a log of many processes the failing one is named:  "epx rank 3: <what failed>".
#pragma once

#include <stdexcept>
#include <string>

#include "epx/export.hpp"

namespace epx {

enum class ErrorKind {
  invalid_argument,  // the caller passed something the contract does not allow
  cuda,              // a CUDA runtime call failed
  nccl,              // an NCCL call failed
  timeout,           // a device-side wait ran past the team's timeout
  system,            // an operating-system call failed (fork, pipe, sockets, ...)
  internal,          // a broken invariant inside epx: a bug, please report it
};

EPX_API const char* to_string(ErrorKind kind);

class EPX_API Error : public std::runtime_error {
 public:
  // rank < 0 means "no rank known yet" (before a team exists).
  Error(ErrorKind kind, int rank, const std::string& what);

  ErrorKind kind() const noexcept { return kind_; }
  int rank() const noexcept { return rank_; }

 private:
  ErrorKind kind_;
  int rank_;
};

}  // namespace epx
