// Host-side launchers of the HT kernels (src/kernels/ht/*.cu). Arguments are validated by the caller
// (src/api/ht_buffer.cpp) before any of these runs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "kernels/ht/ht_view.hpp"

namespace epx::kernels::ht {

struct LayoutOutputs {
  int32_t* send_pos = nullptr;             // [T][R] or null
  int32_t* rank_counts = nullptr;          // [R]
  int32_t* expert_token_counts = nullptr;  // [E] totals, or null
  bool* is_token_in_rank = nullptr;        // [T][R] or null
  InputError* error = nullptr;             // first invalid expert id, or null
};

// The layout kernel's private words (zero when the buffer is made; see layout.cu for the protocol).
struct LayoutState {
  unsigned long long tiles_taken;  // tiles handed out to the CTAs of the running call
  uint64_t calls;                  // calls finished; the running call's tile totals carry calls + 1
};
// The layout kernel's private memory, one per buffer (layout_scratch_bytes, zeroed).
struct LayoutScratch {
  transport::TeamView team;  // bounds the wait for earlier tiles' counts
  LayoutState* state;
  uint64_t* tile_totals;     // [tiles][R]
  int32_t* expert_partials;  // [tiles][E]: each tile's tokens per expert
};
std::size_t layout_scratch_bytes(int max_tokens, int num_ranks, int num_experts);
LayoutScratch layout_scratch(void* memory, int max_tokens, int num_ranks, int num_experts,
                             const transport::TeamView& team);

struct LayoutArgs {
  const void* topk_idx;
  bool topk_int64;
  int64_t topk_row_stride;
  int32_t num_tokens, topk, num_ranks, num_experts;
  LayoutOutputs out;
  LayoutScratch scratch;
};

// Sets what the kernels need before their first launch (shared-memory limits) and loads every HT kernel
// (see detail::load_kernel); call it before any rank can have an HT kernel in flight.
void prepare_kernels();
void load_layout_kernel();
void load_combine_kernel();
void load_stage_combine_input_kernel();

// The largest hidden size: a BF16 row must fit the dispatch kernel's shared-memory stages.
constexpr int kMaxHidden = 16384;

// Counts tokens per rank and per expert, and each token's position among the tokens for each rank,
// in one kernel. Expert counts go as one row per tile of kLayoutTokensPerCta tokens to the scratch's
// expert_partials and, when expert_token_counts is given, summed there.
// num_experts <= kMaxLayoutExperts, topk <= kMaxLayoutTopk, num_ranks <= kMaxNvlinkRanks.
constexpr int kMaxLayoutExperts = 8192;  // the histogram lives in shared memory (32 KiB)
constexpr int kMaxLayoutTopk = 32;
void launch_layout(const LayoutArgs& args, cudaStream_t stream);

// What the count exchange needs beyond the buffer, the handle and the tokens.
struct CountExchangeArgs {
  HostMailbox* mailbox;  // N, expert counts and sticky errors for the host
  uint32_t ticket;       // written to mailbox->ready once N is known
  int32_t expert_alignment;
  int64_t num_worst_tokens;  // > 0: mark padding rows [N, num_worst_tokens) as "no token"
  bool cached;               // only the handshake: counts come from the handle
  bool refused;              // this rank's input was refused on the host (it sends nothing): announce it failed
};

struct DispatchArgs {
  BufferView buffer;
  HandleView handle;
  TokensView tokens;
  CountExchangeArgs counts;
  uint32_t* blocks_done;     // private counter of finished CTAs (zero between calls)
  uint32_t* tokens_claimed;  // private counter of tokens claimed past each warp's first (zero between calls)
};
// One dispatch: CTA 0 announces the counts (or, cached, takes part in the handshake), every CTA waits
// for every rank's, then writes its rows into their receivers' final place and signals; the last CTA
// waits for every source's rows.
// after_layout: the kernel just before it on the stream is the layout kernel of this dispatch; the
// dispatch then starts while the layout runs (programmatic dependent launch) and waits for its
// outputs after loading its first rows.
void launch_dispatch(const DispatchArgs& args, int num_blocks, bool after_layout, cudaStream_t stream);

struct CombineArgs {
  BufferView buffer;
  HandleView handle;
  const uint16_t* y;  // the caller's y [num_rows][H] (or the combine input itself): this rank's own rows
  int64_t y_row_stride;
  const float* weights;  // the caller's weights [num_rows][K] (or the combine input's); null with out_weights
  int64_t weights_row_stride;
  // [T][H] bf16 rows added to the sums, first then second (DeepEP's pair); data null where not given.
  struct Bias {
    const uint16_t* data;
    int64_t row_stride;
  } bias[2];
  uint16_t* out;       // [T][H]
  float* out_weights;  // [T][K] or null (then no weights are read)
  int64_t num_rows;    // rows of y: N, or num_worst_tokens
  int32_t num_tokens, topk, hidden;
  uint32_t* blocks_done;     // private counter of finished CTAs (zero between calls)
  uint32_t* tokens_claimed;  // private counter of tokens claimed past each warp's first two (zero between calls)
  bool staged;  // the copy kernel, right before the combine kernel, copies the rows the peers read (and signals them)
};
// Copies the rows that other ranks will read, those from sources s != me (recv_begin), of y into the
// combine input (copy_y) and of the weights into the combine input's weights (copy_weights), telling
// each home rank its progress; launched right before launch_combine (args.staged), which runs beside
// it (teams of two ranks or more). This rank's own rows stay where the caller has them: the combine
// kernel reads them there. core::kCombineCopyCtas CTAs per home rank.
void launch_stage_combine_input(const CombineArgs& args, bool copy_y, bool copy_weights, cudaStream_t stream);
// Every home rank pulls its tokens' rows from the ranks' combine inputs (which hold y and the
// weights, row for received row; its own rows from args.y and args.weights) and reduces them. With
// args.staged, right behind launch_stage_combine_input, as its programmatic dependent.
void launch_combine(const CombineArgs& args, int num_blocks, cudaStream_t stream);

}  // namespace epx::kernels::ht
