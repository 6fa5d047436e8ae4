// epx::TensorRef — how the C++ API takes and returns tensors: a device pointer, an element type and a
// 2-D shape with element strides. epx never owns the memory a TensorRef points to.
#pragma once

#include <cstdint>

#include "epx/export.hpp"

namespace epx {

enum class ScalarType : uint8_t {
  bf16,      // bfloat16 (2 bytes)
  fp8_e4m3,  // FP8 E4M3, the OCP "e4m3fn" format (1 byte)
  float32,
  int32,
  int64,
  boolean,  // one byte, 0 or 1
};

EPX_API int element_size(ScalarType type);
EPX_API const char* to_string(ScalarType type);

struct TensorRef {
  void* data = nullptr;
  ScalarType type = ScalarType::float32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;  // in elements; a row-major tensor has (cols, 1)
  int64_t col_stride = 1;

  bool empty() const { return data == nullptr; }

  static TensorRef matrix(void* data, ScalarType type, int64_t rows, int64_t cols) {
    return TensorRef{data, type, rows, cols, cols, 1};
  }
  static TensorRef vector(void* data, ScalarType type, int64_t n) { return TensorRef{data, type, 1, n, n, 1}; }
};

}  // namespace epx
