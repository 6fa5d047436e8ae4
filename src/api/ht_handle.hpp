// The routing state one HT dispatch leaves for combine and for cached dispatches. Owns one device
// allocation that holds every array of kernels::ht::HandleView.
#pragma once

#include <cstdint>
#include <vector>

#include "epx/ht.hpp"
#include "kernels/ht/ht_view.hpp"

namespace epx {

class HtHandle {
 public:
  HtHandle(const void* owner, int num_tokens, int topk, int num_ranks, int max_tokens, int num_experts,
           cudaStream_t stream);
  ~HtHandle();
  HtHandle(const HtHandle&) = delete;
  HtHandle& operator=(const HtHandle&) = delete;

  const void* owner;                        // the HtBuffer::Impl that made it
  int num_tokens;                           // T of the dispatch
  int topk;                                 // K of the dispatch
  int64_t num_rows = 0;                     // rows of the dispatch outputs (N, or num_worst_tokens)
  int64_t num_recv = -1;                    // N when the host learnt it
  std::vector<int32_t> expert_counts_host;  // when N is known
  kernels::ht::HandleView view{};

 private:
  void* memory_ = nullptr;
};

}  // namespace epx
