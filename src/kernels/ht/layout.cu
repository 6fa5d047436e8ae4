// HT layout: from topk_idx, each token's ranks and experts, in one pass over the tokens.
//
// Grid: one CTA per tile of kThreads tokens (at least one CTA), one token per thread. Each thread loads
// its token's K ids once, into registers. An id outside [-1, E) is recorded in `error` (first one wins)
// and ignored; the count exchange turns it into a failed call on every rank.
//  * Experts: the CTA counts in shared memory the tokens of its tile naming each expert (a token naming
//    an expert twice counts once) and writes them as the tile's row of the partial counts.
//  * Ranks: a token goes to rank r if any of its experts lives there. Warp ballots and a scan of the
//    warps' counts give its position among the tile's tokens for r; the tokens of earlier tiles come
//    first, so send_pos = (earlier tiles' counts for r) + (position within the tile).
//
// Protocol between the CTAs of one call (LayoutState and tile_totals: private to this rank's buffer,
// zero at creation; a call's kernel runs after the previous call's on the caller's stream):
//  * Thread 0 reads call = calls + 1 and takes the CTA's tile with atomicAdd(tiles_taken, 1), both in
//    flight together (a relaxed read: the last tile resets `calls` only after it has seen this CTA's
//    tile published, and the published word carries the call read). Tiles are handed out in the
//    order the CTAs start: every earlier tile belongs to a CTA that is already running and publishes
//    its counts before it waits for anything. No wait below can deadlock, whatever the grid's size.
//  * Each CTA writes its tile's row of partial expert counts, __syncthreads, then thread r (r < R)
//    publishes the tile's count for rank r with one release store at GPU scope (only this rank's
//    CTAs, on this GPU, read it): tile_totals[tile][r] = (call << kCountBits) | count.
//  * The CTA's threads wait (bounded, acquire) until the words of the earlier tiles carry this call's
//    number, and add their counts into the tile's base positions; __syncthreads.
//  * The CTA of the last tile has then seen every tile published (and so every partial row written):
//    it writes rank_counts (its base plus its own counts), sums the partial rows into
//    expert_token_counts when the caller asked for totals, and resets the state for the next call:
//    tiles_taken = 0 (every tile has been taken) and calls = call (every CTA has read it).
#include <algorithm>

#include "core/area_cursor.hpp"
#include "core/cuda_check.hpp"
#include "kernels/ht/launch.hpp"
#include "kernels/ht/protocol.cuh"
#include "transport/device/phase_trace.hpp"

namespace epx::kernels::ht {
namespace {

constexpr int kThreads = kLayoutTokensPerCta;  // one token per thread
constexpr int kWarps = kThreads / kWarp;
constexpr int kCountBits = 11;  // a tile's count for one rank, at most kThreads, sits below the call number
static_assert(kThreads < (1 << kCountBits), "a tile's count must fit below the call number");
constexpr uint64_t kCountMask = (uint64_t(1) << kCountBits) - 1;

__device__ void record_error(InputError* error, int t, int k, int64_t value) {
  if (error == nullptr || atomicCAS(&error->found, 0, 1) != 0) return;
  error->token = t;
  error->slot = k;
  error->value = value;
  __threadfence_system();
}

__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// Whether a token whose experts live on `ranks` (-1: no expert) goes to rank r.
template <int kMaxTopk>
__device__ bool goes_to(const int (&ranks)[kMaxTopk], int r) {
  bool in = false;
#pragma unroll
  for (int k = 0; k < kMaxTopk; ++k) in |= ranks[k] == r;
  return in;
}

// kMaxTopk: the ids a thread keeps in registers (at least the call's K).
template <int kMaxTopk>
__global__ void __launch_bounds__(kThreads) layout_kernel(LayoutArgs a) {
  __shared__ uint32_t tile_of_cta;
  __shared__ uint64_t call_of_cta;
  __shared__ int warp_offsets[kWarps][kMaxNvlinkRanks];  // per warp: its tokens for r, then their prefix
  __shared__ int tile_counts[kMaxNvlinkRanks];
  __shared__ int base[kMaxNvlinkRanks];   // tokens for r in earlier tiles
  extern __shared__ int expert_counts[];  // [E]
  const int R = a.num_ranks, E = a.num_experts, experts_per_rank = E / R;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  LayoutState* state = a.scratch.state;
  allow_dependent_launch();  // the dispatch kernel after it may start now (see launch_dispatch)
  if (lane == 0) transport::trace<transport::TracePoint::ht_layout_start>(a.scratch.team);
  if (threadIdx.x == 0) {
    call_of_cta = transport::load_relaxed_sys(&state->calls) + 1;  // in flight with the ticket (see above)
    tile_of_cta = uint32_t(atomicAdd(&state->tiles_taken, 1ull));
  }
  // While the ticket is out: the ids of the tile the CTA most likely gets (tickets mostly follow
  // blockIdx) start moving into L2.
  if (const int guess = int(blockIdx.x) * kThreads + int(threadIdx.x); guess < a.num_tokens && a.topk > 0) {
    const int64_t id_bytes = a.topk_int64 ? 8 : 4;
    prefetch_l2(static_cast<const char*>(a.topk_idx) + guess * a.topk_row_stride * id_bytes);
  }
  for (int e = threadIdx.x; e < E; e += kThreads) expert_counts[e] = 0;
  for (int r = threadIdx.x; r < R; r += kThreads) base[r] = 0;
  __syncthreads();
  if (threadIdx.x == 0) transport::trace<transport::TracePoint::ht_layout_ticket>(a.scratch.team);
  const int tile = int(tile_of_cta);
  const uint64_t call = call_of_cta;
  const int t = tile * kThreads + threadIdx.x;
  const bool real = t < a.num_tokens;

  // Every load first, then the checks: the K loads of a thread are in flight together.
  int64_t raw[kMaxTopk];
#pragma unroll
  for (int k = 0; k < kMaxTopk; ++k) {
    raw[k] = real && k < a.topk ? topk_at(a.topk_idx, a.topk_int64, a.topk_row_stride, t, k) : -1;
  }
  int ids[kMaxTopk], ranks[kMaxTopk];
#pragma unroll
  for (int k = 0; k < kMaxTopk; ++k) {
    if (raw[k] < -1 || raw[k] >= E) {
      record_error(a.out.error, t, k, raw[k]);
      raw[k] = -1;
    }
    ids[k] = int(raw[k]);
    ranks[k] = ids[k] < 0 ? -1 : ids[k] / experts_per_rank;
    bool repeated = ids[k] < 0;
#pragma unroll
    for (int j = 0; j < k; ++j) repeated |= ids[j] == ids[k];
    if (!repeated) atomicAdd(&expert_counts[ids[k]], 1);
  }

  for (int r = 0; r < R; ++r) {
    const unsigned in = __ballot_sync(~0u, goes_to(ranks, r));
    if (lane == 0) warp_offsets[warp][r] = __popc(in);
  }
  __syncthreads();
  if (threadIdx.x == 0) transport::trace<transport::TracePoint::ht_layout_counted>(a.scratch.team);
  int32_t* partials = a.scratch.expert_partials;
  if (tile * kThreads < a.num_tokens) {
    for (int e = threadIdx.x; e < E; e += kThreads) partials[int64_t(tile) * E + e] = expert_counts[e];
  }
  for (int r = threadIdx.x; r < R; r += kThreads) {
    int sum = 0;
    for (int w = 0; w < kWarps; ++w) {
      const int n = warp_offsets[w][r];
      warp_offsets[w][r] = sum;
      sum += n;
    }
    tile_counts[r] = sum;
  }
  __syncthreads();  // the partial row is written before the tile is published
  uint64_t* tile_totals = a.scratch.tile_totals;
  for (int r = threadIdx.x; r < R; r += kThreads) {
    transport::store_release_gpu(&tile_totals[int64_t(tile) * R + r], (call << kCountBits) | uint64_t(tile_counts[r]));
  }
  if (threadIdx.x == 0) transport::trace<transport::TracePoint::ht_layout_published>(a.scratch.team);
  bool ok = true;
  for (int i = threadIdx.x; i < tile * R; i += kThreads) {
    ok = ok && transport::wait_at_least(
                   a.scratch.team, &tile_totals[i], call << kCountBits,
                   transport::WaitSite{transport::WaitPhase::ht_layout, a.scratch.team.rank, uint32_t(i / R)});
    if (ok) atomicAdd(&base[i % R], int(transport::load_relaxed_sys(&tile_totals[i]) & kCountMask));
  }
  ok = __syncthreads_and(ok);  // every base is complete; what one thread acquired, all may read
  if (threadIdx.x == 0) transport::trace<transport::TracePoint::ht_layout_bases>(a.scratch.team);

  if (ok) {  // else the team has failed: the call will fail, its outputs are not read
    for (int r = 0; r < R; ++r) {
      const bool in = goes_to(ranks, r);
      const unsigned mask = __ballot_sync(~0u, in);
      if (!real) continue;
      const int position = base[r] + warp_offsets[warp][r] + __popc(mask & ((1u << lane) - 1u));
      if (a.out.send_pos != nullptr) a.out.send_pos[int64_t(t) * R + r] = in ? position : -1;
      if (a.out.is_token_in_rank != nullptr) a.out.is_token_in_rank[int64_t(t) * R + r] = in;
    }
  }
  if (tile != int(gridDim.x) - 1) {
    if (threadIdx.x == 0) transport::trace<transport::TracePoint::ht_layout_end>(a.scratch.team);
    return;
  }
  if (ok) {
    for (int r = threadIdx.x; r < R; r += kThreads) a.out.rank_counts[r] = base[r] + tile_counts[r];
    if (a.out.expert_token_counts != nullptr) {
      const int tiles = layout_tiles(a.num_tokens);
      for (int e = threadIdx.x; e < E; e += kThreads) {
        int32_t n = 0;
        for (int h = 0; h < tiles; ++h) n += partials[int64_t(h) * E + e];
        a.out.expert_token_counts[e] = n;
      }
    }
  }
  if (threadIdx.x == 0) {
    state->tiles_taken = 0;
    state->calls = call;
    transport::trace<transport::TracePoint::ht_layout_end>(a.scratch.team);
  }
}

}  // namespace

void launch_layout(const LayoutArgs& args, cudaStream_t stream) {
  const int blocks = std::max(1, layout_tiles(args.num_tokens));
  const std::size_t histogram_bytes = sizeof(int) * args.num_experts;
  if (args.topk <= 8) {
    layout_kernel<8><<<blocks, kThreads, histogram_bytes, stream>>>(args);
  } else {
    layout_kernel<kMaxLayoutTopk><<<blocks, kThreads, histogram_bytes, stream>>>(args);
  }
  detail::check_launch("ht layout_kernel");
}

void load_layout_kernel() {
  detail::load_kernel(reinterpret_cast<const void*>(layout_kernel<8>), "HT layout kernel");
  detail::load_kernel(reinterpret_cast<const void*>(layout_kernel<kMaxLayoutTopk>), "HT layout kernel");
}

namespace {

// Where the scratch's arrays lie, from its start, and its size: the one layout both functions below use.
struct ScratchOffsets {
  std::size_t tile_totals, expert_partials, end;
};

ScratchOffsets scratch_offsets(int max_tokens, int num_ranks, int num_experts) {
  const std::size_t tiles = layout_tiles(max_tokens);
  core::AreaCursor cursor(16);
  cursor.take(sizeof(LayoutState));
  ScratchOffsets o{};
  o.tile_totals = cursor.take(sizeof(uint64_t) * tiles * num_ranks);
  o.expert_partials = cursor.take(sizeof(int32_t) * tiles * num_experts);
  o.end = cursor.end();
  return o;
}

}  // namespace

std::size_t layout_scratch_bytes(int max_tokens, int num_ranks, int num_experts) {
  return scratch_offsets(max_tokens, num_ranks, num_experts).end;
}

LayoutScratch layout_scratch(void* memory, int max_tokens, int num_ranks, int num_experts,
                             const transport::TeamView& team) {
  const ScratchOffsets o = scratch_offsets(max_tokens, num_ranks, num_experts);
  char* p = static_cast<char*>(memory);
  LayoutScratch s;
  s.team = team;
  s.state = reinterpret_cast<LayoutState*>(p);
  s.tile_totals = reinterpret_cast<uint64_t*>(p + o.tile_totals);
  s.expert_partials = reinterpret_cast<int32_t*>(p + o.expert_partials);
  return s;
}

}  // namespace epx::kernels::ht
