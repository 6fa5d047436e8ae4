#include "api/ht_handle.hpp"

#include <string>

#include "core/area_cursor.hpp"
#include "core/cuda_check.hpp"

namespace epx {

using detail::check_cuda;

namespace {

// Lays the arrays of a HandleView out in one block (each 16-byte aligned); returns the bytes needed.
std::size_t lay_out(int R, int max_tokens, int E, char* base, kernels::ht::HandleView* view) {
  core::AreaCursor cursor(16);
  auto take = [&](std::size_t bytes) { return base + cursor.take(bytes); };
  kernels::ht::HandleView v{};
  v.send_pos = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * std::size_t(max_tokens) * R));
  v.send_begin = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * R));
  v.recv_begin = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * (R + 1)));
  v.expert_counts = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * (E / R)));
  v.rank_counts = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * R));
  v.count_matrix = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * R * R));
  v.expert_totals = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * E));
  v.status = reinterpret_cast<int32_t*>(take(sizeof(int32_t)));
  v.input_error = reinterpret_cast<kernels::ht::InputError*>(take(sizeof(kernels::ht::InputError)));
  if (view != nullptr) *view = v;
  return cursor.end();
}

}  // namespace

HtHandlePool::HtHandlePool(int num_ranks, int max_tokens, int num_experts, int preallocate, cudaStream_t stream)
    : num_ranks_(num_ranks), max_tokens_(max_tokens), num_experts_(num_experts) {
  for (int i = 0; i < preallocate; ++i) free_.push_back(allocate(stream));
  check_cuda(cudaStreamSynchronize(stream), "zeroing the HT handle blocks");
}

HtHandlePool::~HtHandlePool() {
  for (auto& b : blocks_) {
    cudaFree(b->memory);
    cudaEventDestroy(b->last_use);
  }
}

HtHandlePool::Block* HtHandlePool::allocate(cudaStream_t stream) {
  auto block = std::make_unique<Block>();
  block->bytes = lay_out(num_ranks_, max_tokens_, num_experts_, nullptr, nullptr);
  check_cuda(cudaMalloc(&block->memory, block->bytes), "cudaMalloc(HT handle block)");
  // Zeroed once: every array is rewritten by each dispatch before it is read, except input_error,
  // which the count exchange clears after reading it.
  check_cuda(cudaMemsetAsync(block->memory, 0, block->bytes, stream), "cudaMemsetAsync(HT handle block)");
  check_cuda(cudaEventCreateWithFlags(&block->last_use, cudaEventDisableTiming), "cudaEventCreate");
  lay_out(num_ranks_, max_tokens_, num_experts_, static_cast<char*>(block->memory), &block->view);
  blocks_.push_back(std::move(block));
  free_.reserve(blocks_.size());  // release() then never allocates (it runs in a destructor)
  return blocks_.back().get();
}

HtHandlePool::Block* HtHandlePool::acquire(cudaStream_t stream) {
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(stream, &capturing), "cudaStreamIsCapturing");
  const bool in_capture = capturing != cudaStreamCaptureStatusNone;
  Block* block = nullptr;
  {
    std::lock_guard lock(mutex_);
    if (free_.empty()) {
      EPX_REQUIRE(!in_capture, "HT dispatch inside a CUDA graph capture needs a free handle block, and all " +
                                   std::to_string(blocks_.size()) +
                                   " are held: drop handles first, or raise HtBufferOptions::handle_blocks");
      block = allocate(stream);
    } else {
      block = free_.back();
      free_.pop_back();
    }
    block->captured = in_capture;
  }
  // Inside a capture the graph's own launch order covers earlier uses (and a capture may not wait on
  // an event recorded outside it).
  if (!in_capture) {
    check_cuda(cudaStreamWaitEvent(stream, block->last_use, 0), "cudaStreamWaitEvent(HT handle block)");
  }
  return block;
}

void HtHandlePool::release(Block* block) {
  std::lock_guard lock(mutex_);
  if (!block->captured) free_.push_back(block);  // a captured graph may replay it: keep it out of reuse
}

void HtHandlePool::mark_use(Block* block, cudaStream_t stream) {
  check_cuda(cudaEventRecord(block->last_use, stream), "cudaEventRecord(HT handle block)");
}

std::size_t HtHandlePool::bytes() const {
  std::lock_guard lock(mutex_);
  std::size_t total = 0;
  for (const auto& b : blocks_) total += b->bytes;
  return total;
}

HtHandle::HtHandle(std::shared_ptr<HtHandlePool> pool, HtHandlePool::Block* block, int num_tokens_, int topk_,
                   int expert_alignment_)
    : num_tokens(num_tokens_),
      topk(topk_),
      expert_alignment(expert_alignment_),
      pool_(std::move(pool)),
      block_(block) {}

HtHandle::~HtHandle() { pool_->release(block_); }

}  // namespace epx
