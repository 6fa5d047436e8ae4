#include "epx/tensor.hpp"

namespace epx {

int element_size(ScalarType type) {
  switch (type) {
    case ScalarType::bf16:
      return 2;
    case ScalarType::fp8_e4m3:
      return 1;
    case ScalarType::float32:
      return 4;
    case ScalarType::int32:
      return 4;
    case ScalarType::int64:
      return 8;
    case ScalarType::boolean:
      return 1;
  }
  return 0;
}

const char* to_string(ScalarType type) {
  switch (type) {
    case ScalarType::bf16:
      return "bf16";
    case ScalarType::fp8_e4m3:
      return "fp8_e4m3";
    case ScalarType::float32:
      return "float32";
    case ScalarType::int32:
      return "int32";
    case ScalarType::int64:
      return "int64";
    case ScalarType::boolean:
      return "bool";
  }
  return "unknown";
}

}  // namespace epx
