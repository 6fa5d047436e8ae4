// epx::LlBuffer — low-latency dispatch and combine over NVLink (decode). The contract is DESIGN.md
// §1.2-1.3; here is what each call guarantees.
//
// Terms: R ranks, E experts (expert e on rank e / E_local, E_local = E / R), T <= T_max tokens on this
// rank, H hidden, K top-k, C = R * T_max rows per local expert. topk_idx [T][K] is int64 or int32,
// -1 = no expert.
//
// No call waits on the host: shapes are fixed when the buffer is made, every count stays on the device,
// and dispatch + combine can be captured in a CUDA graph and replayed. In a graph, each kernel is the
// programmatic dependent of the kernel before it (a caller's or ours): it starts as that kernel's CTAs
// exit and reads nothing before that kernel has completed, so its launch overlaps the other's end.
//
// dispatch: a token crosses NVLink once per destination rank (not once per expert), carrying its local
// expert ids (and weights, if given); the receiver expands it into the packed layout the caller
// allocated (LlDispatchOutputs): rows of local expert e are x[e][0 .. recv_count[e]), in blocks by source
// rank, the blocks in the order me + 1, me + 2, ..., wrapping, this rank (me) last, tokens ascending within
// a block; layout_range[e][s] = (begin, count) of source s's rows; src_idx[e][row] = the token's index
// on its source. A token naming one expert in two slots gets one row. Rows past recv_count[e] are left
// as they were. Payload: BF16, or FP8 E4M3 made on the sending side with one scale per 128 columns
// (amax floored at 1e-4, scale = amax / 448, optionally rounded up to a power of two, optionally packed
// as UE8M0 exponents, four per int32).
//
// combine: y [E_local][C][H] BF16 in the layout dispatch produced goes back; out[t] on the home rank
// is the weighted sum of its experts' rows, accumulated in float32, as BF16. Two summation orders:
//   * local (default): the expert side sums its own experts' rows of a token, weighted, and sends one
//     row per (token, rank); the home rank adds those rows, ranks ascending. Cuts NVLink bytes by up
//     to K / R. The weights are those given to dispatch, which travel with the token; a rank whose
//     dispatch had none gives them to combine instead (as DeepEP's API does), and they go to the
//     expert side at the start of the call (T x K words; the expert side's sums wait for them).
//     Either way the result is the same, bit for bit.
//   * naive: one row per (token, slot) travels back and the home rank adds w[k] * y_k for k ascending
//     (with the weights given to combine): bit-identical to the plain per-expert order, for debugging.
// combine reads y in place (no copy into a library buffer is ever needed); combine_buffer() is a
// convenience for callers that want the library to own y.
//
// Collective calls, ordering and buffer sets. dispatch and combine are collective: all ranks call them
// in the same order with the same shapes and options.
// Each kind alternates between two buffer sets, so that a call's sends never wait for the previous
// call's receive step: two calls of a kind may be in flight. Before writing into a peer's set, a
// kernel waits until that peer has finished reading the set's previous use, so no order of calls
// (captured graphs replayed any number of times included) overwrites unread data. The rules:
//   * Calls on one buffer run in the order they were made, whatever their streams (each waits for the
//     previous one). Call them with the team's CUDA device current.
//   * A rank tells its peers that it has read a call's data when it starts its next call of the same
//     kind, and a peer's call two calls later waits for that. So every rank keeps calling: a rank that
//     stops while its peers go on makes their calls wait (and time out once wait_timeout has passed).
//   * A dispatch's handle stays valid for combine until the dispatch two calls later (same set);
//     combine refuses a handle whose set has been reused since. A graph that replays a dispatch
//     without its combine makes the handles captured with it stale in the same way (unchecked there).
//   * With send_only, the returned receive step must be run (exactly once) before the call of the same
//     kind two calls later; capture a send_only call and its receive step in the same graph. A combine's
//     receive step reads its handle's routing, so it must also run while the handle lasts (before the
//     dispatch two calls after the handle's).
//   * A combine given the weights (local order, after a dispatch without them) sends them at the start
//     of its sends, and the expert ranks' sends of the same call wait for them (bounded). So with
//     weights given to combine, a rank's combine sends (a send_only call's included) wait until every
//     rank whose tokens it received has started its combine, and a rank that stops calling makes its
//     peers' current combine time out, not one two calls later.
//   * dispatch writes the caller's outputs during its receive step; combine reads y during its sends
//     (a call without send_only: during its one kernel, its receive step included) and writes out
//     during its receive step. It reads topk_weights during its sends (local order) or its receive
//     step (naive). Rows past recv_count[e] are not written. A source with
//     no rows for expert e gets layout_range[e][s] = (rows of the blocks before its own, 0).
// Every argument is checked before anything is launched; a bad one throws epx::Error naming it. What
// only the device can see (an expert id outside [-1, E), an expired wait) is recorded and reported by
// check_errors() on the rank that saw it; such an id counts as -1 meanwhile, on the sending and the
// home rank alike.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>

#include "epx/export.hpp"
#include "epx/streams.hpp"
#include "epx/team.hpp"
#include "epx/tensor.hpp"

namespace epx {

struct LlBufferOptions {
  int max_tokens_per_rank = 128;  // T_max: the most tokens one rank sends in one call, at most 1024
  int hidden = 7168;              // H: the largest hidden size, a multiple of 128, at most 16384
  int max_topk = 8;               // K_max, at most 16
  int num_experts = 256;          // E, a multiple of the team size, at most 4096
  // Rank masking on timeout (DeepEP's shrink mode): a wait on a peer that runs past the team's
  // wait_timeout masks that peer (see LlBuffer::set_rank_masked) instead of failing the team, and the
  // call goes on without it. Off: an expired wait fails the team (check_errors throws).
  bool mask_on_timeout = false;
};

// Kernel configuration. num_sms = 0 means "the default for this GPU and team"; config() returns what
// it became.
struct LlConfig {
  int num_sms = 0;  // CTAs of every LL kernel: at most the GPU's SMs (on a single-GPU team, every rank's together)
};
// The default: every SM of the GPU (a team of one GPU per rank), or an equal share of them (a
// single-GPU team, whose ranks' CTAs must all be resident at once).
EPX_API LlConfig default_ll_config(int num_ranks, int sm_count, bool single_gpu);

enum class LlCombineOrder { local, naive };

// One source rank's rows of one local expert: rows [begin, begin + count). The count comes first, so
// that read as one little-endian int64 (as DeepEP's layout_range is) the count is the low 32 bits and
// begin the high 32.
struct LlRange {
  int32_t count = 0;
  int32_t begin = 0;
};

// The packed outputs of a dispatch, allocated by the caller (LlBuffer::output_bytes says how much).
// Element (e, row, g) of a scale tensor is at scales[e * expert_stride + row * row_stride + g * col_stride]
// (in elements): row-major is (C * G, G, 1); DeepEP's layout, per expert column-major, is (C * G, 1, C).
struct LlScalesLayout {
  int64_t expert_stride = 0, row_stride = 0, col_stride = 0;
};
struct LlDispatchOutputs {
  void* x = nullptr;                // [E_local][C][H]: fp8_e4m3 with use_fp8, else bf16; dense, 16-byte aligned
  void* scales = nullptr;           // use_fp8: float [E_local][C][H/128], or with use_ue8m0 int32 [E_local][C][H/512]
  LlScalesLayout scales_layout{};   // all zero: row-major
  int32_t* recv_count = nullptr;    // [E_local]
  int32_t* src_idx = nullptr;       // [E_local][C]
  LlRange* layout_range = nullptr;  // [E_local][R]
};

struct LlDispatchArgs {
  TensorRef x;             // [T][H] bf16
  TensorRef topk_idx;      // [T][K] int64 or int32
  TensorRef topk_weights;  // [T][K] float32, or empty. Given here, they travel with the token (else
                           // combine takes them, in either order).
  bool use_fp8 = true;
  bool round_scale = false;  // scales rounded up to powers of two (needs use_fp8)
  bool use_ue8m0 = false;    // scales packed as UE8M0 (needs round_scale and H % 512 == 0)
  LlDispatchOutputs out;
  int32_t* cumulative_recv_count = nullptr;  // [E_local] or null: receive counts are added to it
  bool send_only = false;                    // return after the sends; the caller runs `receive` later
  // [R] or null: per source rank, the SM clock cycles (clock64) this rank's warps spent waiting for that
  // rank's data are added to it (a warp that finds the data there adds nothing). For spotting a slow
  // rank (DeepEP's dispatch_wait_recv_cost_stats); one atomic add per warp (or thread) that waited.
  int64_t* cumulative_wait_cycles = nullptr;
};

// What combine needs to know about a dispatch (a small value; copy it freely, but pass it back as it
// was: combine refuses a handle whose fields differ from what its dispatch returned, or a stale one).
struct LlHandle {
  const void* buffer = nullptr;  // the LlBuffer that made it
  int set = 0;                   // which of the two dispatch buffer sets
  uint64_t generation = 0;       // the set's use number: a later dispatch on the set makes it stale
  int num_tokens = 0, topk = 0, hidden = 0;
  bool has_weights = false;  // topk_weights were given to dispatch (or this rank had no tokens)
};

struct LlDispatchResult {
  LlHandle handle;
  cudaEvent_t finished = nullptr;  // with Streams::async (after the receive step, or the sends with send_only)
  // With send_only: launches the receive step on Streams::stream (after the sends, whatever stream they
  // ran on). Run it exactly once.
  std::function<void()> receive;
};

// The routing comes from the handle: dispatch kept, on the device, which ranks and slots each token went to.
struct LlCombineArgs {
  TensorRef y;             // [E_local * C][H] bf16: row e * C + i is expert e's row i; rows 16-byte aligned
  TensorRef topk_weights;  // [T][K] float32: with the naive order; with local, exactly when the dispatch had none
  LlHandle handle;
  LlCombineOrder order = LlCombineOrder::local;
  TensorRef out;  // [T][H] bf16, dense rows, 16-byte aligned
  bool send_only = false;
  // [R] or null: as LlDispatchArgs::cumulative_wait_cycles, per expert-side rank (its rows; with the
  // weights given here, also the expert side's waits for this rank's weights, on that rank).
  int64_t* cumulative_wait_cycles = nullptr;
};

struct LlCombineResult {
  cudaEvent_t finished = nullptr;
  std::function<void()> receive;  // with send_only, as for dispatch
};

class EPX_API LlBuffer {
 public:
  // Collective over the team. Allocates the symmetric areas (see buffer_bytes()).
  LlBuffer(Team& team, const LlBufferOptions& options, const LlConfig& config = {});
  ~LlBuffer();
  LlBuffer(const LlBuffer&) = delete;
  LlBuffer& operator=(const LlBuffer&) = delete;

  LlDispatchResult dispatch(const LlDispatchArgs& args, const Streams& streams);
  LlCombineResult combine(const LlCombineArgs& args, const Streams& streams);

  // An optional place for combine's y, [E_local * C][H_max] bf16, owned by the buffer; allocated on the
  // first call (buffer_bytes() counts it from then on). Passing any other y costs nothing extra. For a
  // call with a smaller hidden size, pass a view of its first columns (row stride H_max).
  TensorRef combine_buffer();

  // Reports what kernels recorded without the host waiting: an invalid expert id, an expired wait.
  // Call after synchronising the streams the buffer's calls ran on (say, once per step).
  void check_errors();

  // Rank masking: this rank stops exchanging with a masked rank. Dispatch sends it nothing (entries
  // naming its experts count as -1: no row anywhere, nothing to combine) and receives nothing from it
  // (it counts as a source of no tokens); combine leaves its rows out; no call waits for it or writes
  // to it. Each rank has its own mask; a rank that is masked by some ranks but still calls is not
  // waited for by them and itself waits for them in vain (its waits expire), so mask a rank on every
  // other rank. A masked rank is set by these calls or by an expired wait (mask_on_timeout).
  // The three calls run on `stream`, ordered with the buffer's calls (capturable).
  //   set_rank_masked: masks or unmasks `rank` (not this rank). Unmasking is for a rank that made
  //     every call meanwhile, and that unmasks this rank at the same point of the call sequence (it
  //     takes the rank's sequence numbers to be this rank's); a rank that missed calls is behind, and
  //     waits for it expire.
  //   query_rank_mask: writes int32 [R] to device memory `out`: 1 for a masked rank, else 0.
  //   clear_rank_mask: unmasks every rank (same rules).
  // A buffer destroyed while a rank is masked marks the team failed: tearing the team down then does
  // not wait for peers that may be gone (see Team), and the team takes no more collective calls.
  void set_rank_masked(int rank, bool masked, cudaStream_t stream);
  void query_rank_mask(int32_t* out, cudaStream_t stream);
  void clear_rank_mask(cudaStream_t stream);

  const LlBufferOptions& options() const;
  const LlConfig& config() const;
  void set_config(const LlConfig& config);
  // Device memory this buffer allocated on this rank: symmetric areas, private state, and
  // combine_buffer() once asked for. Excludes the caller's dispatch outputs.
  std::size_t buffer_bytes() const;
  // Bytes one rank needs for `options` on a team of `num_ranks` (what buffer_bytes() will report, before
  // combine_buffer()); throws epx::Error for options no buffer can be made with.
  static std::size_t required_bytes(const LlBufferOptions& options, int num_ranks);

  // Bytes of each caller-allocated dispatch output for `hidden` (the buffer's if 0).
  struct OutputBytes {
    std::size_t x, scales, recv_count, src_idx, layout_range;
  };
  OutputBytes output_bytes(bool use_fp8, bool use_ue8m0, int hidden = 0) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace epx
