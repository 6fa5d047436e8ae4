// epx::HtBuffer — high-throughput dispatch and combine over NVLink (training and prefill).
// The contract is DESIGN.md §1.1; here is what each call guarantees.
//
// Terms: R ranks, E experts (expert e on rank e / (E/R)), T tokens on this rank (T <= the buffer's
// max_tokens_per_rank), H hidden, K top-k. topk_idx [T][K] is int64 or int32, -1 = no expert.
//
// dispatch: each token goes once to every rank that holds one of its experts. This rank receives N
// rows ordered by source rank, then source token index. Outputs (HtDispatchResult) are views into the
// buffer's receive area: valid until the next dispatch on this buffer is enqueued, so work that reads
// them must be ordered before that call (same stream, or an event). Three forms:
//   * exact: the call returns once N is known (the host waits on host-mapped memory, bounded by the
//     team's timeout); result.num_rows = N.
//   * worst-case (num_worst_tokens > 0): no host wait at all, CUDA-graph capturable; outputs have
//     num_worst_tokens rows, rows N.. are padding (src_idx -1, topk_idx -1, weights 0).
//   * cached (args.cached = an earlier result's handle, same routing): skips the count exchange, and
//     the host wait where that dispatch was exact (N and the per-expert counts are the handle's).
// combine: y [N][H] BF16 (one row per received row, as dispatch returned them) goes back; the home rank
// writes out[t] = sum over ranks that received t of y's row (float32 accumulation, ranks ascending),
// plus bias, then second_bias (each optional, added once), as BF16 [T][H] in the original token
// order. Optional weights are summed the same way. Home ranks read the rows they need straight from
// the other ranks' memory (combine_input()), in one pass that also reduces.
//
// Every call but get_layout is collective (all ranks call it in the same order, with the same form,
// dtype, hidden size and top-k) and runs on the given stream, or on the buffer's communication stream
// when HtStreams::async is set (see HtStreams). Calls on one buffer run in the order they were made,
// whatever their streams (each waits for the previous one). Call them with the team's CUDA device
// current. Every argument is checked before anything is launched; a bad one throws epx::Error naming it.
// One exception: a dispatch with more tokens than max_tokens_per_rank (the one argument that differs
// between ranks by nature) still takes part, with none, so that every rank's dispatch fails at once with
// an error naming that rank, rather than the others waiting for it until the team's timeout.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "epx/export.hpp"
#include "epx/streams.hpp"
#include "epx/team.hpp"
#include "epx/tensor.hpp"

namespace epx {

struct HtBufferOptions {
  int max_tokens_per_rank = 4096;  // T_max: the most tokens one rank dispatches in one call
  int hidden = 7168;               // H, a multiple of 128, at most 16384 (largest hidden the buffer holds)
  int max_topk = 8;                // K_max
  int num_experts = 256;           // E, a multiple of the team size
  // Device copies of routing state (handles) made up front: dispatches inside a CUDA graph capture
  // can only use these (a capture cannot allocate), and each captured one stays with its graph.
  int handle_blocks = 4;
  // The buffer's own combine output ([max_tokens_per_rank][hidden] bf16, private). Without it every
  // combine passes HtCombineArgs::out, and the buffer is that much smaller.
  bool combine_output = true;
};

// Kernel configuration. Defaults per rank count come from the bench (bench/results/).
// There are no chunk sizes to set: dispatch writes each row straight into its final place in the receiver's
// buffer and combine reads each row straight from the sender's, so there are no ring buffers to size.
struct HtConfig {
  int num_sms = 16;  // CTAs of the send kernels, at most the GPU's SMs; fewer leave more SMs to overlapping compute
};
EPX_API HtConfig default_ht_config(int num_ranks);

// Where a call runs (see Streams).
using HtStreams = Streams;

class HtHandle;

struct HtLayout {                            // caller-allocated device outputs of get_layout
  int32_t* num_tokens_per_rank = nullptr;    // [R]
  int32_t* num_tokens_per_expert = nullptr;  // [E]
  bool* is_token_in_rank = nullptr;          // [T][R]
};

struct HtDispatchArgs {
  TensorRef x;                             // [T][H] bf16 or fp8_e4m3
  TensorRef x_scales;                      // fp8 only: [T][H/128] float32, any strides (column-major accepted)
  TensorRef topk_idx;                      // [T][K] int64 or int32
  TensorRef topk_weights;                  // [T][K] float32, or empty
  int expert_alignment = 1;                // per-expert counts rounded up to a multiple of this
  int64_t num_worst_tokens = 0;            // > 0: worst-case form with this many output rows
  std::shared_ptr<const HtHandle> cached;  // cached form: the handle of an earlier dispatch
};

struct HtDispatchResult {
  int64_t num_rows = 0;                  // rows of every output: N (exact, cached) or num_worst_tokens
  int64_t num_recv_tokens = -1;          // N, or -1 in worst-case form (then it is only on the device)
  TensorRef recv_x;                      // [rows][H], the dtype of x
  TensorRef recv_x_scales;               // fp8: [rows][H/128] float32, row-major
  TensorRef recv_src_idx;                // [rows] int32
  TensorRef recv_topk_idx;               // [rows][K], the dtype of topk_idx, local expert ids or -1
  TensorRef recv_topk_weights;           // [rows][K] float32 (0 where recv_topk_idx is -1)
  TensorRef num_recv_tokens_per_expert;  // [E_local] int32, on the device
  // [R][R] int32 on the device, held by the handle: [s][d] = tokens rank s sends rank d in this dispatch
  // (the whole team's; DeepEP's rank_prefix_matrix is its running sum over s). 0s after a failed input.
  TensorRef count_matrix;
  std::vector<int32_t> num_recv_tokens_per_expert_host;  // exact and cached forms only
  std::shared_ptr<const HtHandle> handle;                // for combine and cached dispatch
  cudaEvent_t finished = nullptr;                        // with HtStreams::async
};

// Caller memory that copy_dispatch_outputs fills: each tensor given gets the output of its name of the
// buffer's latest dispatch (the same type and shape; any row stride, contiguous columns); the empty ones
// are skipped.
struct HtDispatchCopies {
  TensorRef recv_x, recv_x_scales, recv_src_idx, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert;
};

struct HtCombineArgs {
  TensorRef y;                             // [rows >= N][H] bf16, row i for received row i
  TensorRef topk_weights;                  // [rows >= N][K] float32, or empty: every rank passes weights, or none does
  TensorRef bias;                          // [T][H] bf16, or empty
  std::shared_ptr<const HtHandle> handle;  // every rank passes the handle of the same dispatch
  // Where the sums go: [T][H] bf16 with row stride H, 16-byte aligned (and [T][K] float32 with row
  // stride K for the weights' sums, with topk_weights only). Empty: the buffer's own outputs (out needs
  // HtBufferOptions::combine_output).
  TensorRef out;
  TensorRef out_weights;
  TensorRef second_bias;  // [T][H] bf16, or empty: added after bias (DeepEP's pair of biases)
};

struct HtCombineResult {
  TensorRef x;             // [T][H] bf16: args.out, or in the buffer, valid until the next combine is enqueued
  TensorRef topk_weights;  // [T][K] float32 when weights were given: args.out_weights, or in the buffer
  cudaEvent_t finished = nullptr;
};

class EPX_API HtBuffer {
 public:
  // Collective over the team. Allocates the symmetric receive areas (see buffer_bytes()).
  HtBuffer(Team& team, const HtBufferOptions& options, const HtConfig& config = {});
  ~HtBuffer();
  HtBuffer(const HtBuffer&) = delete;
  HtBuffer& operator=(const HtBuffer&) = delete;

  // Local (not collective). Returns HtStreams' `finished` event with async, else null. An invalid expert
  // id is reported by the next get_layout or check_errors().
  cudaEvent_t get_layout(const TensorRef& topk_idx, const HtLayout& out, const HtStreams& streams);
  HtDispatchResult dispatch(const HtDispatchArgs& args, const HtStreams& streams);
  // Local (not collective). Copies the outputs of the latest dispatch on this buffer into caller memory,
  // ordered as a call on this buffer is (after that dispatch, before the next call, whatever the
  // streams), so the copies stay valid when the next dispatch rewrites the views. Returns HtStreams'
  // `finished` event with async, else null.
  cudaEvent_t copy_dispatch_outputs(const HtDispatchCopies& to, const HtStreams& streams);
  HtCombineResult combine(const HtCombineArgs& args, const HtStreams& streams);

  // Where the other ranks' combines read y from: [rows][hidden] bf16 (and [rows][topk] float32
  // weights) in the buffer's symmetric memory. A caller that writes y here (say, as its expert GEMM's
  // output) and passes this view as HtCombineArgs::y saves combine a copy; of any other y, the rows
  // that other ranks read are copied here first (this rank's own rows are read where they are).
  // Write it only after the previous combine on this buffer, in stream order (that combine ends once
  // every rank has finished reading it).
  TensorRef combine_input(int64_t rows, int64_t hidden) const;
  TensorRef combine_input_weights(int64_t rows, int64_t topk) const;

  // Reports errors that kernels recorded without the host waiting for them: an invalid topk_idx on
  // some rank, a worst-case dispatch whose N exceeded num_worst_tokens, an invalid id in get_layout, a
  // device wait that expired. Exact-form dispatches report them on their own; callers of the
  // worst-case form call this after synchronising their stream (say, once per step).
  void check_errors();

  const HtConfig& config() const;
  void set_config(const HtConfig& config);
  // Device memory this buffer allocated on this rank (symmetric areas and private scratch).
  std::size_t buffer_bytes() const;
  // Bytes needed per rank for `options` on a team of `num_ranks` (to size or to explain an error).
  static std::size_t required_bytes(const HtBufferOptions& options, int num_ranks);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace epx
