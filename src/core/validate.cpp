#include "core/validate.hpp"

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/rank_context.hpp"

namespace epx::core {

std::string shape_string(const TensorRef& t) {
  return std::string(to_string(t.type)) + " [" + std::to_string(t.rows) + "][" + std::to_string(t.cols) +
         "] strides (" + std::to_string(t.row_stride) + ", " + std::to_string(t.col_stride) + ")";
}

namespace {

std::string accepted_types(const Expect& e) {
  std::string accepted;
  for (ScalarType type : e.types) accepted += (accepted.empty() ? "" : " or ") + std::string(to_string(type));
  return accepted;
}

}  // namespace

void check_tensor(const TensorRef& t, const Expect& e) {
  const auto name = [&] { return std::string(e.name); };  // messages are built only when a check fails
  const bool type_ok = std::find(e.types.begin(), e.types.end(), t.type) != e.types.end();
  EPX_REQUIRE(type_ok, name() + " must be " + accepted_types(e) + ", got " + to_string(t.type));
  EPX_REQUIRE(t.rows >= 0 && t.cols >= 0, name() + " has a negative shape: " + shape_string(t));
  if (e.rows >= 0) {
    EPX_REQUIRE(t.rows == e.rows, name() + " must have " + std::to_string(e.rows) + " rows, got " + shape_string(t));
  }
  if (e.cols >= 0) {
    EPX_REQUIRE(t.cols == e.cols, name() + " must have " + std::to_string(e.cols) + " columns, got " + shape_string(t));
  }
  if (t.rows == 0 || t.cols == 0) return;  // nothing will be read or written
  EPX_REQUIRE(t.data != nullptr, name() + " is a null pointer but has " + shape_string(t));
  if (e.dense_rows) {
    EPX_REQUIRE(t.col_stride == 1, name() + " must have contiguous columns (col_stride 1), got " + shape_string(t));
    EPX_REQUIRE(t.rows == 1 || t.row_stride >= t.cols, name() + " rows overlap: " + shape_string(t));
  } else {
    EPX_REQUIRE(t.row_stride > 0 && t.col_stride > 0, name() + " must have positive strides, got " + shape_string(t));
  }
  const auto address = reinterpret_cast<std::uintptr_t>(t.data);
  const int64_t pitch = t.row_stride * element_size(t.type);
  const int alignment = std::max(e.alignment, element_size(t.type));  // at least the element's own
  EPX_REQUIRE(address % alignment == 0, name() + " must be " + std::to_string(alignment) + "-byte aligned");
  EPX_REQUIRE(t.rows == 1 || pitch % alignment == 0, name() + " row pitch (" + std::to_string(pitch) +
                                                         " bytes) must be a multiple of " + std::to_string(alignment));
}

void check_optional_tensor(const TensorRef& t, const Expect& e) {
  if (t.data == nullptr && (t.rows == 0 || t.cols == 0)) return;  // absent
  check_tensor(t, e);
}

void check_num_sms(const char* what, int num_sms, int num_ranks, bool single_gpu, int sm_count) {
  EPX_REQUIRE(num_sms >= 1 && num_sms <= kMaxCtas,
              std::string(what) + " must be in [1, " + std::to_string(kMaxCtas) + "], got " + std::to_string(num_sms));
  EPX_REQUIRE(!single_gpu || num_sms * num_ranks <= sm_count,
              std::string(what) + " = " + std::to_string(num_sms) + " on a single-GPU team of " +
                  std::to_string(num_ranks) + " ranks needs " + std::to_string(num_sms * num_ranks) +
                  " resident CTAs; this GPU has " + std::to_string(sm_count) + " SMs");
  EPX_REQUIRE(num_sms <= sm_count, std::string(what) + " = " + std::to_string(num_sms) +
                                       " needs that many CTAs resident at once (the CTAs of a call wait for each "
                                       "other's work); this GPU has " +
                                       std::to_string(sm_count) + " SMs, one CTA each");
}

}  // namespace epx::core
