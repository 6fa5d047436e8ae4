#include "core/validate.hpp"

#include <algorithm>
#include <cstdint>

#include "core/rank_context.hpp"

namespace epx::core {

using detail::require;

std::string shape_string(const TensorRef& t) {
  return std::string(to_string(t.type)) + " [" + std::to_string(t.rows) + "][" + std::to_string(t.cols) +
         "] strides (" + std::to_string(t.row_stride) + ", " + std::to_string(t.col_stride) + ")";
}

void check_tensor(const TensorRef& t, const Expect& e) {
  const std::string name = e.name;
  bool type_ok = false;
  std::string accepted;
  for (ScalarType type : e.types) {
    type_ok |= t.type == type;
    accepted += (accepted.empty() ? "" : " or ") + std::string(to_string(type));
  }
  require(type_ok, name + " must be " + accepted + ", got " + to_string(t.type));
  require(t.rows >= 0 && t.cols >= 0, name + " has a negative shape: " + shape_string(t));
  if (e.rows >= 0) {
    require(t.rows == e.rows, name + " must have " + std::to_string(e.rows) + " rows, got " + shape_string(t));
  }
  if (e.cols >= 0) {
    require(t.cols == e.cols, name + " must have " + std::to_string(e.cols) + " columns, got " + shape_string(t));
  }
  if (t.rows == 0 || t.cols == 0) return;  // nothing will be read or written
  require(t.data != nullptr, name + " is a null pointer but has " + shape_string(t));
  if (e.dense_rows) {
    require(t.col_stride == 1, name + " must have contiguous columns (col_stride 1), got " + shape_string(t));
    require(t.rows == 1 || t.row_stride >= t.cols, name + " rows overlap: " + shape_string(t));
  } else {
    require(t.row_stride > 0 && t.col_stride > 0, name + " must have positive strides, got " + shape_string(t));
  }
  const auto address = reinterpret_cast<std::uintptr_t>(t.data);
  const int64_t pitch = t.row_stride * element_size(t.type);
  const int alignment = std::max(e.alignment, element_size(t.type));  // at least the element's own
  require(address % alignment == 0, name + " must be " + std::to_string(alignment) + "-byte aligned");
  require(t.rows == 1 || pitch % alignment == 0,
          name + " row pitch (" + std::to_string(pitch) + " bytes) must be a multiple of " + std::to_string(alignment));
}

void check_optional_tensor(const TensorRef& t, const Expect& e) {
  if (t.data == nullptr && (t.rows == 0 || t.cols == 0)) return;  // absent
  check_tensor(t, e);
}

}  // namespace epx::core
