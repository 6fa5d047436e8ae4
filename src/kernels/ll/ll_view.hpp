// What the LL kernels receive: plain structs passed by value (no host types).
#pragma once

#include <cstdint>

#include "core/divisor.hpp"
#include "core/ll_areas.hpp"
#include "epx/ll.hpp"
#include "transport/device/team_view.hpp"

namespace epx::kernels::ll {

// What the LL kernels tell the host without it waiting (host-mapped; LlBuffer::check_errors reads it).
struct LlHostReport {
  int32_t input_error;  // 0 or 1: the first invalid expert id a dispatch met on this rank, sticky until reported
  int32_t token, slot;
  int64_t value;
  uint32_t masked[kMaxNvlinkRanks];  // a mirror of rank_mask (core::LlAreas), for the host
};

// The buffer's areas (offsets of core::LlAreas): symmetric ones on every rank, private ones here.
struct LlView {
  transport::TeamView team;
  transport::SymmetricView base;  // base.base[r]: rank r's symmetric allocation
  char* own;                      // this rank's private allocation
  uint64_t freed, manifests, expert_counts, headers, payloads, combine_rows, combine_weights;
  uint64_t blocks_done, pending_freed, message_slots, entry_rows, entry_weights, home, rank_mask;
  int32_t max_tokens, hidden, max_topk, num_experts, combine_slots;
  core::Divisor by_local_experts;  // num_experts / team.nranks (its d): an expert's rank
  core::Divisor by_max_tokens;     // max_tokens (its d): a message's source and token
  bool mask_on_timeout;            // LlBufferOptions::mask_on_timeout
  LlHostReport* host_report;
  // Per call, or null: [R] cycles of waiting for each rank's data (LlDispatchArgs::cumulative_wait_cycles).
  unsigned long long* wait_cycles;

  __host__ __device__ int experts_per_rank() const { return int(by_local_experts.d); }
  __host__ __device__ int64_t rows_per_expert() const { return int64_t(team.nranks) * max_tokens; }  // C
  // Message index of (set, source, token) in headers, payloads and entry_rows.
  __host__ __device__ int64_t message(int set, int src, int t) const {
    return (int64_t(set) * team.nranks + src) * max_tokens + t;
  }
  // owner's "freed" flag of (op, set) about `peer` (protocol.cuh).
  __device__ uint64_t* freed_flag(int owner, int op, int set, int peer) const {
    return reinterpret_cast<uint64_t*>(base.base[owner] + freed) + (op * core::kLlSets + set) * team.nranks + peer;
  }
  // Which of source src's tokens send owner a message, [T_max / 32] stamped words of 32 bits.
  __device__ core::LlWord* manifest_of(int owner, int set, int src) const {
    const int words = core::ll_manifest_words(max_tokens);
    return reinterpret_cast<core::LlWord*>(base.base[owner] + manifests) + (int64_t(set) * team.nranks + src) * words;
  }
  // Source src's tokens per local expert of owner, [E_local] stamped words.
  __device__ core::LlWord* expert_counts_of(int owner, int set, int src) const {
    return reinterpret_cast<core::LlWord*>(base.base[owner] + expert_counts) +
           (int64_t(set) * team.nranks + src) * experts_per_rank();
  }
  // The header of (set, src, t) at owner, [kLlHeaderWords] stamped words.
  __device__ core::LlWord* header(int owner, int set, int src, int t) const {
    return reinterpret_cast<core::LlWord*>(base.base[owner] + headers) + message(set, src, t) * core::kLlHeaderWords;
  }
  // Line l of a payload or a combine row is vectors [8 l, 8 l + 8) (core::kLlLineBytes); each is as
  // long as a BF16 row of the buffer's hidden needs in its form (a call's are its first lines).
  __device__ int64_t payload_vectors() const { return int64_t(core::ll_row_lines(2 * hidden)) * core::kLlLineVectors; }
  __device__ int64_t combine_row_vectors() const {
    return int64_t(core::ll_combine_row_lines(2 * hidden)) * core::kLlLineVectors;
  }
  // The payload of (set, src, t) at owner.
  __device__ uint4* payload(int owner, int set, int src, int t) const {
    return reinterpret_cast<uint4*>(base.base[owner] + payloads) + message(set, src, t) * payload_vectors();
  }
  __device__ uint4* combine_row(int owner, int set, int slot, int t) const {
    return reinterpret_cast<uint4*>(base.base[owner] + combine_rows) +
           ((int64_t(set) * combine_slots + slot) * max_tokens + t) * combine_row_vectors();
  }
  // The weights of home rank src's token t at owner, [K_max] stamped words (a combine given weights).
  __device__ core::LlWord* combine_weights_of(int owner, int set, int src, int t) const {
    return reinterpret_cast<core::LlWord*>(base.base[owner] + combine_weights) + message(set, src, t) * max_topk;
  }
  // The private CTA counter of op's receive step (FreedRecord).
  __device__ uint32_t* blocks_done_of(int op) const { return reinterpret_cast<uint32_t*>(own + blocks_done) + op; }
  __device__ uint64_t* pending_freed_of(int op) const { return reinterpret_cast<uint64_t*>(own + pending_freed) + op; }
  __device__ uint32_t* message_slots_of(int set, int src, int t) const {
    return reinterpret_cast<uint32_t*>(own + message_slots) + message(set, src, t);
  }
  __device__ int32_t* entry_rows_of(int set, int src, int t) const {
    return reinterpret_cast<int32_t*>(own + entry_rows) + message(set, src, t) * max_topk;
  }
  __device__ float* entry_weights_of(int set, int src, int t) const {
    return reinterpret_cast<float*>(own + entry_weights) + message(set, src, t) * max_topk;
  }
  __device__ core::LlHomeToken* home_of(int set, int t) const {
    return reinterpret_cast<core::LlHomeToken*>(own + home) + int64_t(set) * max_tokens + t;
  }
  __device__ uint32_t* rank_mask_of(int r) const { return reinterpret_cast<uint32_t*>(own + rank_mask) + r; }
};

enum LlPhases : uint32_t { kSend = 1, kReceive = 2 };  // which of a call's two steps a launch runs

struct DispatchParams {
  LlView v;
  int32_t set;
  uint32_t phases;  // LlPhases: the sends, the receive step, or both in one launch
  // Input.
  const uint16_t* x;
  int64_t x_row_stride;
  int32_t hidden, num_tokens, topk;
  const void* topk_idx;
  bool topk_int64;
  int64_t topk_row_stride;
  const float* weights;  // or null
  int64_t weights_row_stride;
  bool fp8, round_scale, ue8m0;
  // Outputs (LlDispatchOutputs).
  void* out_x;
  void* out_scales;
  LlScalesLayout scales_layout;
  int32_t* recv_count;
  int32_t* src_idx;
  LlRange* layout_range;
  int32_t* cumulative_recv_count;  // or null
  // Filled by launch_dispatch: topk (K >= 1), a row's send items (8 lines each) in the call's format, the
  // parts a received message is cut into (work items of the receive step) and each part's line
  // instructions (the last part: what is left).
  core::Divisor by_topk, by_row_items, by_receive_parts;
  int32_t part_instructions;
};

struct CombineParams {
  LlView v;
  int32_t set;           // the combine's buffer set
  int32_t dispatch_set;  // the set of the dispatch it reverses
  uint32_t phases;
  const uint16_t* y;
  int64_t y_row_stride;
  int32_t hidden, num_tokens, topk;
  bool naive;
  const float* weights;  // the home side's [T][K]: naive order, or local with the weights given here; else null
  int64_t weights_row_stride;
  uint16_t* out;
  int64_t out_row_stride;
  // Filled by launch_combine: a row's items (8 lines each), and the parts a message is cut into (work
  // items of the send step).
  core::Divisor by_row_items, by_send_parts;
};

// Host-side launchers (src/kernels/ll/*.cu); arguments are checked by src/api/ll_buffer.cpp first.
// The load_* functions load a kernel's code now (see detail::load_kernel); call them before any rank
// can have an LL kernel in flight.
void load_dispatch_kernel();
void load_combine_kernel();
void launch_dispatch(const DispatchParams& params, int num_blocks, cudaStream_t stream);
void launch_combine(const CombineParams& params, int num_blocks, cudaStream_t stream);
void load_rank_mask_kernel();
// Masks (or unmasks) ranks [first, last) other than this one (rank_mask.cu).
void launch_update_rank_mask(const LlView& view, int first, int last, bool masked, cudaStream_t stream);

}  // namespace epx::kernels::ll
