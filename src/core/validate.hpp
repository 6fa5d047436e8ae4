// Argument checks shared by the API entry points: each throws epx::Error (invalid_argument) naming the
// argument and what was wrong, before anything is launched.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "epx/tensor.hpp"

namespace epx::core {

struct Expect {
  const char* name;                         // the argument, as the caller knows it
  std::initializer_list<ScalarType> types;  // accepted element types
  int64_t rows = -1;                        // required rows, or -1 for any
  int64_t cols = -1;                        // required columns, or -1 for any
  bool dense_rows = true;                   // columns contiguous (col_stride 1)
  int alignment = 1;                        // bytes: data and row pitch must be multiples of it
};

// Checks a tensor that must be present.
void check_tensor(const TensorRef& t, const Expect& e);
// Checks a tensor that may be absent (data == nullptr with 0 rows, or an all-default TensorRef).
void check_optional_tensor(const TensorRef& t, const Expect& e);

std::string shape_string(const TensorRef& t);

// The most CTAs a config may ask for (HtConfig::num_sms, LlConfig::num_sms).
inline constexpr int kMaxCtas = 1024;

// A config's CTA count (`what`: "HtConfig::num_sms" or "LlConfig::num_sms", 1 to kMaxCtas) on a team of `num_ranks`
// whose GPU has `sm_count` SMs. A call's CTAs wait for each other's work (and for its peers' CTAs, which
// wait for theirs), so all of them must be resident at once, counted one per SM: at most sm_count CTAs, and on
// one GPU (`single_gpu`) every rank's together. A grid larger than that would wait until its bounded
// waits expire.
void check_num_sms(const char* what, int num_sms, int num_ranks, bool single_gpu, int sm_count);

}  // namespace epx::core
