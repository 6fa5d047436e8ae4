// The routing state one HT dispatch leaves for combine and for cached dispatches.
//
// Its device arrays (kernels::ht::HandleView) live in a block of the buffer's HandlePool: blocks are
// reused rather than freed, so neither dispatch nor dropping a handle calls cudaMalloc/cudaFree (which
// would stall the device, and cannot run inside graph capture). Every call that uses a block records
// the block's `last_use` event on its stream; a block taken again makes the new stream wait for that
// event first, so a block is never rewritten while earlier kernels may still read it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "epx/ht.hpp"
#include "kernels/ht/ht_view.hpp"

namespace epx {

class HtHandlePool {
 public:
  struct Block {
    void* memory = nullptr;
    std::size_t bytes = 0;
    cudaEvent_t last_use = nullptr;
    bool captured = false;  // taken inside a graph capture: the graph keeps using it, so never reused
    kernels::ht::HandleView view{};
  };

  // The preallocated blocks are zeroed on `stream`, which the constructor then waits for.
  HtHandlePool(int num_ranks, int max_tokens, int num_experts, int preallocate, cudaStream_t stream);
  ~HtHandlePool();
  HtHandlePool(const HtHandlePool&) = delete;
  HtHandlePool& operator=(const HtHandlePool&) = delete;

  // A block for a new dispatch on `stream`. Grows the pool when none is free, except inside a graph
  // capture (an allocation there would break it): then it throws, asking for more preallocated blocks.
  Block* acquire(cudaStream_t stream);
  void release(Block* block);
  static void mark_use(Block* block, cudaStream_t stream);
  std::size_t bytes() const;

 private:
  // A new block, zeroed in `stream`'s order (a plain cudaMemset would run on the legacy stream, which
  // kernels on non-blocking streams do not wait for).
  Block* allocate(cudaStream_t stream);
  int num_ranks_, max_tokens_, num_experts_;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Block>> blocks_;
  std::vector<Block*> free_;
};

class HtHandle {
 public:
  HtHandle(std::shared_ptr<HtHandlePool> pool, HtHandlePool::Block* block, int num_tokens, int topk,
           int expert_alignment);
  ~HtHandle();
  HtHandle(const HtHandle&) = delete;
  HtHandle& operator=(const HtHandle&) = delete;

  int num_tokens;        // T of the dispatch
  int topk;              // K of the dispatch
  int expert_alignment;  // of the dispatch; a cached dispatch must use the same
  int64_t num_rows = 0;  // rows of the dispatch outputs (N, or num_worst_tokens)
  // What the host learned of an exact-form dispatch (N and the rows per local expert), so that a cached
  // dispatch of it needs no host wait; -1 and empty after a worst-case dispatch.
  int64_t num_recv_tokens = -1;
  std::vector<int32_t> num_recv_tokens_per_expert_host;
  const kernels::ht::HandleView& view() const { return block_->view; }
  void mark_use(cudaStream_t stream) const { HtHandlePool::mark_use(block_, stream); }
  // The pool of the buffer that made it (the handle keeps it alive, so the address identifies the buffer).
  const HtHandlePool* pool() const { return pool_.get(); }

 private:
  std::shared_ptr<HtHandlePool> pool_;
  HtHandlePool::Block* block_;
};

}  // namespace epx
