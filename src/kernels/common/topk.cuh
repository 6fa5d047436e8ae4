// Reading a top-k table of either accepted integer type.
#pragma once

#include <cstdint>

namespace epx::kernels {

// topk_idx[t][k], int64 or int32.
__device__ inline int64_t topk_at(const void* topk, bool is_int64, int64_t row_stride, int t, int k) {
  return is_int64 ? static_cast<const int64_t*>(topk)[t * row_stride + k]
                  : static_cast<const int32_t*>(topk)[t * row_stride + k];
}

}  // namespace epx::kernels
