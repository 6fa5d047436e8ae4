// HT combine, pull form: each home rank reads, for each of its tokens, the rows that the ranks which
// received the token hold in their combine input (over NVLink; its own rows from the caller's y, which
// combine_input.cu does not copy), and reduces them in one pass:
//   out[t] = bf16(sum over r ascending with send_pos[t][r] >= 0 of float(row of t on r),
//                 then + float(bias[t]), then + float(second_bias[t])),
// plain float adds in that order (bit-equal to the reference); the weights likewise. Rank r's row of
// token t is send_begin[r] + send_pos[t][r] (the dispatch's layout).
//
// Data path: the copy engine (bulk loads, bulk_copy.cuh) pulls the rows, so the bytes in flight are
// bounded by shared memory, not by registers. A row is cut into pieces of kPieceBytes. Each warp owns
// kSlots piece buffers and walks its pieces in the order they are added: its tokens in turn, each
// token chunk by chunk, the ranks holding a row ascending within a chunk. Lane 0 keeps the next
// kSlots - 1 pieces loading; the lanes add each piece from shared memory as it lands, and after a
// chunk's last rank they write that chunk of out[t]. The pull is bound by instruction issue (measured:
// docs/PERFORMANCE.md), so a piece's bookkeeping is kept short: each row's source is worked out once per
// token (gather_rows), a chunk's stores are predicated, and the slot and phase are counted, not divided.
// Lane 0 of each warp starts its own loads: a warp's bulk copies issue one after another, each waiting on
// its operands, so twenty warps overlap that latency where fewer loader warps did not.
// Work split: each warp's first two tokens are static (consecutive tokens on consecutive CTAs); after
// them it claims the next unclaimed token from a private counter (tokens_claimed), so that warps that
// pull faster take more tokens: the warps' rates differ, and with a static split the slowest set the
// call's end (measured: docs/PERFORMANCE.md). The last CTA resets the counter (signal_done), after every
// claim.
//
// Protocol (done words of core::HtFlag):
//   * Every CTA computes seq = sequence[kCombineDone] + 1; the last CTA stores it once every home rank
//     has read every row of this rank's combine input (completion, below), so after every CTA of this
//     kernel has read the old value (the copy kernel's CTAs read it before this kernel can start).
//   * My combine input holds home rank s's rows (its block) in groups of kCombineCopyRows; copy word
//     progress(s, me, l) (in s's memory) is stamped(seq, d) once groups l, l + K, ...
//     (d of them, K = kCombineCopyCtas) are there. The copy kernel raises the words as it copies
//     (a.staged; combine_input.cu). It runs first, and this kernel is launched as its programmatic
//     dependent: every copy CTA allows that launch as it starts, so the two run side by side. Where the
//     launch is not early (a tool that serialises kernels, or no SM free), this kernel starts after
//     the copy and finds every word set: it never waits for a kernel queued behind it. Otherwise the
//     caller wrote the input in place earlier on this stream, and CTA 0 sets every word to
//     (seq, kEveryGroup) at the start.
//   * Before lane 0 of a warp loads the first piece of row j of my block on rank r != me, unless j is
//     below the warp's ready_until[r], the warp waits: lane 0 (acquire, bounded) for the word of j's
//     group g until progress(me, r, g % K) carries seq's stamp and at least g / K + 1 groups
//     (wait_for_stamp); then lane l reads word l (acquire; d_l = 0 unless it carries seq's stamp), and
//     ready_until[r] becomes the prefix every word promises, min over l of (l + K * d_l) groups. A
//     __syncwarp orders the lanes' acquires before lane 0's proxy fence and bulk loads. So a warp waits
//     a few times per rank while the copy runs ahead of it, and once when the input was in place.
//     This rank's own rows come from the caller's y.
//   * A warp's tokens: lane 0 stores the k-th token the loader takes into tokens[k % kTokenRing] before
//     gather_rows, whose __syncwarp orders the store before the lanes read it as they add. The loader
//     takes a token only when its first piece is next, fewer than kTokenRing tokens ahead of the
//     adding, so an entry is rewritten only after several __syncwarp (one a piece) have followed its reads.
//   * Piece buffers: piece k of a warp goes to slot k % kSlots and completes phase (k / kSlots) & 1 of
//     that slot's mbarrier (lane 0 announces the bytes, the copy engine completes them; every lane
//     waits, bounded). Lane 0 reloads a slot only after __syncwarp has followed every lane's reads of
//     its previous piece, and a proxy fence orders those reads before the copy engine's writes.
//   * Completion: once every piece it started has landed, each CTA signals kCombineDone to every rank
//     ("I have finished reading your input"; signal_done, protocol.cuh) and counts itself in a private
//     counter; the one that counts itself last waits until every CTA of every rank r has signalled
//     (wait_for_every_cta) and then stores sequence = seq. So when the kernel ends, nobody reads this
//     rank's combine input any more, and the caller may write the next one in stream order (what
//     follows on the stream follows the copy kernel too). A CTA of a home rank that reads nothing of
//     this rank signals at once, so its next call's signal may come while this rank still waits for
//     this one's: the wait takes it as this call's (protocol.cuh).
//     (A warp whose wait expired stops with loads possibly in flight; its team has failed then, and
//     signals nothing.)
#include "core/cuda_check.hpp"
#include "kernels/common/bf16.cuh"
#include "kernels/common/bulk_copy.cuh"
#include "kernels/common/launch.hpp"
#include "kernels/ht/copy.cuh"
#include "kernels/ht/launch.hpp"
#include "kernels/ht/protocol.cuh"
#include "transport/device/phase_trace.hpp"
#include "transport/device/wait.cuh"

namespace epx::kernels::ht {
namespace {

constexpr int kWarpsPerCta = 20;
constexpr int kThreads = kWarpsPerCta * kWarp;
constexpr int kPieceBytes = 2048;                                 // a piece: this much of one rank's row
constexpr int kVectorsPerPiece = kPieceBytes / 16;                // 16-byte vectors of a piece
constexpr int kVectorsPerLane = kVectorsPerPiece / kWarp;         // those a lane adds
constexpr int kSlots = 5;                                         // piece buffers per warp
constexpr int kStageBytes = kWarpsPerCta * kSlots * kPieceBytes;  // 200 KiB of dynamic shared memory
constexpr int kTokenRing = 8;  // a warp's tokens, the loader's to the adder's: the loader takes <= kSlots ahead
static_assert(kTokenRing > kSlots, "every token between the adder's and the loader's fits the ring");
constexpr int kMaxRanks = kMaxNvlinkRanks;

// The ranks holding a row of one token, ascending: where each row starts (this rank's own row in the
// caller's y, another rank's in its combine input), its index among that rank's rows, and the rank.
struct TokenRows {
  const uint8_t* src[kMaxRanks];
  int32_t row[kMaxRanks];
  uint8_t rank[kMaxRanks];
};

// A CTA's shared memory: the stage, and per warp its barriers, the rows of the token it loads and its
// ready_until (the kernel's arrays), within the 227 KiB a CTA may have on Hopper, with room for the
// protocol's few flags.
static_assert(kStageBytes +
                      kWarpsPerCta * (kSlots * sizeof(uint64_t) + sizeof(TokenRows) + kMaxRanks * sizeof(uint32_t) +
                                      kTokenRing * sizeof(int32_t)) +
                      256 <=
                  227 * 1024,
              "the combine's shared memory exceeds what a CTA may have");

constexpr int kRanksPerLane = (kMaxRanks + kWarp - 1) / kWarp;

// What one lane holds of a token's send positions (ranks lane, lane + 32, ...; -1: none), or of the
// send_begin of those ranks: loaded ahead of their use, so their latency hides behind pieces.
struct PerRank {
  int32_t v[kRanksPerLane];
};
__device__ PerRank load_per_rank(const int32_t* values, int R) {
  PerRank p;
#pragma unroll
  for (int q = 0; q < kRanksPerLane; ++q) {
    const int r = q * kWarp + int(threadIdx.x % kWarp);
    p.v[q] = r < R ? values[r] : -1;
  }
  return p;
}
__device__ PerRank load_positions(const CombineArgs& a, int R, int64_t t) {
  return load_per_rank(a.handle.send_pos + t * R, R);
}

// How many ranks hold a row of a token (the whole warp, from its positions).
__device__ int count_rows(const PerRank& pos) {
  int n = 0;
#pragma unroll
  for (int q = 0; q < kRanksPerLane; ++q) n += __popc(__ballot_sync(0xffffffffu, pos.v[q] >= 0));
  return n;
}

// The whole warp fills `out` from a token's positions (`begin`: send_begin), each row's source included,
// and returns how many ranks hold a row of it.
__device__ int gather_rows(const CombineArgs& a, const PerRank& pos, const PerRank& begin, TokenRows& out) {
  const BufferView& b = a.buffer;
  const int lane = threadIdx.x % kWarp, row_bytes = 2 * a.hidden;
  __syncwarp();  // every lane has finished with the previous contents
  int n = 0;
#pragma unroll
  for (int q = 0; q < kRanksPerLane; ++q) {
    const uint32_t present = __ballot_sync(0xffffffffu, pos.v[q] >= 0);
    if (pos.v[q] >= 0) {
      const int at = n + __popc(present & ((1u << lane) - 1u)), r = q * kWarp + lane;
      const int64_t row = begin.v[q] + pos.v[q];
      out.src[at] = r == b.team.rank ? reinterpret_cast<const uint8_t*>(a.y + row * a.y_row_stride)
                                     : b.at<uint8_t>(r, b.combine_input) + row * row_bytes;
      out.rank[at] = uint8_t(r);
      out.row[at] = int32_t(row);
    }
    n += __popc(present);
  }
  __syncwarp();
  return n;
}

// acc[k] += float(BF16 k of v).
__device__ void accumulate(float (&acc)[8], const int4& v) {
#pragma unroll
  for (int k = 0; k < 8; ++k) acc[k] = acc[k] + bf16_at(reinterpret_cast<const uint4&>(v), k);
}

// Writes a lane's share of one chunk of a token's output row (the chunk: `vectors` vectors from vector
// `first`; fewer than a piece's only in a row's partial last chunk): its sums, plus the same vectors of
// each bias row given (null where not), first then second, rounded to BF16.
__device__ void write_chunk(float (&acc)[kVectorsPerLane][8], int4* out_row, const int4* const (&bias_rows)[2],
                            int first, int vectors) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (const int4* row : bias_rows) {
    if (row == nullptr) continue;
#pragma unroll
    for (int u = 0; u < kVectorsPerLane; ++u) {
      if (u * kWarp + lane < vectors) accumulate(acc[u], load_stream(row + first + u * kWarp + lane));
    }
  }
  int4* out = out_row + first;
#pragma unroll
  for (int u = 0; u < kVectorsPerLane; ++u) {
    const uint4 packed = to_bf16(acc[u]);
    if (u * kWarp + lane < vectors) out[u * kWarp + lane] = reinterpret_cast<const int4&>(packed);
  }
}

// Row t of a bias, or null where it was not given.
__device__ const int4* bias_row(const CombineArgs::Bias& bias, int64_t t) {
  return bias.data != nullptr ? reinterpret_cast<const int4*>(bias.data + t * bias.row_stride) : nullptr;
}

// Token t's weight for top-k slot k: its rows' weights added in ascending rank order (the reference's).
__device__ float sum_weights(const CombineArgs& a, int64_t t, int k) {
  const BufferView& b = a.buffer;
  const int R = b.team.nranks;
  float w = 0.0f;
  for (int r = 0; r < R; ++r) {
    const int32_t pos = a.handle.send_pos[t * R + r];
    if (pos < 0) continue;
    const int64_t row = int64_t(a.handle.send_begin[r]) + pos;
    w = w + (r == b.team.rank ? a.weights[row * a.weights_row_stride + k]
                              : b.at<float>(r, b.combine_input_weights)[row * a.topk + k]);
  }
  return w;
}

// Lanes below topk write token t's weights, if the caller asked for them.
__device__ void write_weights(const CombineArgs& a, int64_t t) {
  const int lane = threadIdx.x % kWarp;
  if (a.out_weights != nullptr && lane < a.topk) a.out_weights[t * a.topk + lane] = sum_weights(a, t, lane);
}

// The whole warp writes token t, which no rank holds a row of: its biases alone (zeros without), weights 0.
// A vector at a time, not write_chunk's whole chunk: it runs in the loader while the adder's sums are live,
// and a chunk's sums beside those spilled (244 bytes, 2026-11-30).
__device__ void write_token_without_rows(const CombineArgs& a, int64_t t) {
  const int4* const bias_rows[2] = {bias_row(a.bias[0], t), bias_row(a.bias[1], t)};
  int4* out = reinterpret_cast<int4*>(a.out + t * a.hidden);
  for (int v = threadIdx.x % kWarp; v < a.hidden / 8; v += kWarp) {
    float acc[8] = {};
    for (const int4* row : bias_rows) {
      if (row != nullptr) accumulate(acc, load_stream(row + v));
    }
    const uint4 packed = to_bf16(acc);
    out[v] = reinterpret_cast<const int4&>(packed);
  }
  write_weights(a, t);
}

// Which slot a warp's next piece goes to, and the phase of that slot's mbarrier it completes: piece k
// goes to slot k % kSlots, phase (k / kSlots) & 1, counted as it goes instead of divided out per piece.
struct SlotCursor {
  int slot = 0;
  uint32_t phase = 0;
  __device__ void advance() {
    if (++slot < kSlots) return;
    slot = 0;
    phase ^= 1u;
  }
};

// The caller wrote the combine input in place (no copy kernel): CTA 0 tells every home rank that all
// its rows are there (see the protocol).
__device__ void signal_every_group(const BufferView& b, uint64_t seq) {
  const int me = b.team.rank;
  for (int i = threadIdx.x; i < b.team.nranks * core::kCombineCopyCtas; i += blockDim.x) {
    const int s = i / core::kCombineCopyCtas;
    if (s != me) {
      transport::store_release_sys(b.combine_progress_of(s, me, i % core::kCombineCopyCtas),
                                   core::stamped(seq, core::kEveryGroup));
    }
  }
}

// The next piece a warp loads: of its token (rows gathered in `rows`, n of them; tokens[taken - 1]),
// which of the token's rows, and the byte offset in it. Every lane holds the same copy; lane 0 starts
// the loads and claims the tokens (see the work split).
struct PieceLoader {
  const CombineArgs& a;
  TokenRows& rows;
  uint8_t* slots;
  uint64_t* landed;       // [kSlots] mbarriers
  uint32_t* ready_until;  // [R]: rank r's combine input holds my block's rows below ready_until[r]
  int32_t* tokens;        // [kTokenRing]: the warp's k-th token with rows is tokens[k % kTokenRing]
  int R, row_bytes;
  uint64_t seq;
  PerRank begin;                                // send_begin
  PerRank next_pos = {};                        // the positions of token `upcoming`, loading
  int upcoming = 0, claimed = 0;                // the warp's next token (T: none); lane 0: the one after it
  int taken = 0, n = 0, offset = 0, index = 0;  // tokens taken so far; the next piece: from byte offset of row index
  SlotCursor next;                              // where the next piece started goes

  // The warp's first token's positions load, and it moves to the first token some rank holds a row of.
  __device__ void start() {
    const int T = a.num_tokens, stride = gridDim.x * kWarpsPerCta,
              first = (threadIdx.x / kWarp) * gridDim.x + blockIdx.x;
    upcoming = min(first, T);
    claimed = first + stride;  // the second is static too: no claim's latency at the start
    if (upcoming < T) next_pos = load_positions(a, R, upcoming);
    find_token();
  }

  // Moves to the warp's next token that some rank holds a row of (writing those no rank does: they
  // have no pieces), takes it (tokens[taken++]), and starts loading the positions of the token after it
  // and claiming the one after that: their latencies hide behind the token's pieces (dependent loads
  // there stalled the warp's whole pipeline once a token). Without one, taken stays.
  __device__ void find_token() {
    const int T = a.num_tokens;
    while (upcoming < T) {
      const int t = upcoming;
      const PerRank pos = next_pos;
      upcoming = min(__shfl_sync(0xffffffffu, claimed, 0), T);
      if (upcoming < T) {
        next_pos = load_positions(a, R, upcoming);
        if (threadIdx.x % kWarp == 0) claimed = 2 * gridDim.x * kWarpsPerCta + int(atomicAdd(a.tokens_claimed, 1u));
      }
      if (threadIdx.x % kWarp == 0) tokens[taken % kTokenRing] = t;  // the lanes read it after gather_rows' __syncwarp
      n = gather_rows(a, pos, begin, rows);
      if (n > 0) {
        ++taken;
        return;
      }
      write_token_without_rows(a, t);
    }
    n = 0;
  }

  // The whole warp: waits until rank r's combine input holds `row` of my block, then takes the prefix
  // of the block that r's copy words promise as this warp's ready_until[r] (see the protocol).
  // Returns false on every lane when the wait failed.
  __device__ bool await_row(int r, int64_t row) const {
    static_assert(core::kCombineCopyCtas == kWarp, "a lane per copy CTA");
    constexpr int K = core::kCombineCopyCtas;
    const BufferView& b = a.buffer;
    const int lane = threadIdx.x % kWarp, me = b.team.rank;
    const int64_t block_begin = a.handle.send_begin[r];  // my block's first row on r
    const int64_t g = (row - block_begin) / core::kCombineCopyRows;
    bool ok = true;
    if (lane == 0) {
      const bool first_wait = ready_until[r] == 0;
      ok = wait_for_stamp(b.team, b.combine_progress_of(me, r, int(g % K)), seq, uint32_t(g / K + 1),
                          transport::WaitSite{transport::WaitPhase::ht_combine_ready, r, uint32_t(row - block_begin)});
      if (first_wait) transport::trace<transport::TracePoint::ht_combine_first_ready>(b.team);
    }
    if (!__shfl_sync(~0u, ok, 0)) return false;
    // Lane l reads copy CTA l's word (no later call's value can be there: see the protocol). Groups
    // below l + K * done_l are there for every l.
    const uint64_t word = transport::load_acquire_sys(b.combine_progress_of(me, r, lane));
    const uint32_t done = core::stamped_in(word, seq) ? core::stamped_value(word) : 0u;
    int64_t groups = done == core::kEveryGroup ? int64_t(INT32_MAX) : lane + int64_t(done) * K;
    for (int offset = kWarp / 2; offset > 0; offset /= 2) groups = min(groups, __shfl_xor_sync(~0u, groups, offset));
    __syncwarp();  // every lane's acquire, before lane 0's bulk loads
    if (lane == 0) {
      ready_until[r] = uint32_t(min(block_begin + groups * core::kCombineCopyRows, int64_t(UINT32_MAX)));
      fence_async_global();  // the acquires, before the bulk loads of those rows
    }
    __syncwarp();
    return true;
  }

  // Lane 0 starts loading the next piece into slot next.slot (whose previous piece every lane
  // has added: see the protocol), the first piece of another rank's row once that rank's copy holds
  // it; then every lane moves on to the piece after it. Returns false on every lane when a wait failed.
  __device__ bool start_next() {
    if (n == 0) return true;  // no token left
    if (offset == 0) {        // a row's first piece
      const int r = rows.rank[index];
      const int64_t row = rows.row[index];
      if (r != a.buffer.team.rank && row >= ready_until[r] && !await_row(r, row)) return false;
    }
    if (threadIdx.x % kWarp == 0) {
      const int slot = next.slot;
      const uint32_t bytes = min(kPieceBytes, row_bytes - offset);
      fence_async_shared();  // the lanes' reads of the slot's previous piece come first
      mbarrier_expect_bytes(&landed[slot], bytes);
      bulk_load(slots + slot * kPieceBytes, rows.src[index] + offset, bytes, &landed[slot]);
    }
    next.advance();
    if (++index < n) return true;
    index = 0;
    offset += kPieceBytes;
    if (offset < row_bytes) return true;
    offset = 0;
    find_token();
    return true;
  }
};

__global__ void __launch_bounds__(kThreads, 1) combine_pull_kernel(CombineArgs a) {
  const BufferView& b = a.buffer;
  const int R = b.team.nranks, me = b.team.rank;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  extern __shared__ __align__(128) uint8_t stage_memory[];      // [warp][slot][kPieceBytes]
  __shared__ uint64_t landed_of[kWarpsPerCta][kSlots];          // mbarriers: a slot's piece has landed
  __shared__ TokenRows loading_of[kWarpsPerCta];                // the rows of the token being loaded
  __shared__ uint32_t ready_until_of[kWarpsPerCta][kMaxRanks];  // see PieceLoader::ready_until
  __shared__ int32_t tokens_of[kWarpsPerCta][kTokenRing];       // see PieceLoader::tokens
  if (lane == 0) transport::trace<transport::TracePoint::ht_combine_start>(b.team);
  uint64_t* landed = landed_of[warp];
  uint64_t* sequence = b.at<uint64_t>(me, b.sequence) + core::kCombineDone;
  const uint64_t seq = *sequence + 1;
  if (lane == 0) {
    for (int s = 0; s < kSlots; ++s) mbarrier_init(&landed[s], 1);
  }
  for (int r = lane; r < R; r += kWarp) ready_until_of[warp][r] = 0;
  if (blockIdx.x == 0 && !a.staged) signal_every_group(b, seq);
  __syncthreads();  // the barriers and ready_until are initialised

  const int row_bytes = 2 * a.hidden;
  const PerRank begin = load_per_rank(a.handle.send_begin, R);
  PieceLoader loader{a,
                     loading_of[warp],
                     stage_memory + warp * kSlots * kPieceBytes,
                     landed,
                     ready_until_of[warp],
                     tokens_of[warp],
                     R,
                     row_bytes,
                     seq,
                     begin};
  bool ok = true;
  loader.start();
  for (int k = 0; ok && k < kSlots - 1; ++k) ok = loader.start_next();
  SlotCursor adding;                              // where the next piece added lies
  for (int i = 0; ok && i < loader.taken; ++i) {  // the loader takes each token before its pieces start
    const int64_t t = loader.tokens[i % kTokenRing];
    const int n = count_rows(load_positions(a, R, t));  // the loader read them: in L1
    int4* out_row = reinterpret_cast<int4*>(a.out + t * a.hidden);
    const int4* const bias_rows[2] = {bias_row(a.bias[0], t), bias_row(a.bias[1], t)};
    for (int offset = 0; ok && offset < row_bytes; offset += kPieceBytes) {
      float acc[kVectorsPerLane][8] = {};
      for (int j = 0; j < n; ++j, adding.advance()) {
        __syncwarp();              // every lane has read the previous piece: its slot may be reloaded
        ok = loader.start_next();  // the piece kSlots - 1 after this one, into the slot of the one before
        if (!ok) break;
        const int slot = adding.slot;
        ok = __all_sync(0xffffffffu,
                        mbarrier_wait(b.team, &landed[slot], adding.phase,
                                      transport::WaitSite{transport::WaitPhase::ht_bulk_load, me, uint32_t(t)}));
        if (!ok) break;
        // Every lane adds all its vectors of the slot, with no test: past a partial piece's end (a row's
        // last chunk) they are stale bytes, and go into sums that are never stored.
        const int4* piece = reinterpret_cast<const int4*>(loader.slots + slot * kPieceBytes);
#pragma unroll
        for (int u = 0; u < kVectorsPerLane; ++u) accumulate(acc[u], piece[u * kWarp + lane]);
        if (i == 0 && offset == 0 && j == 0 && lane == 0)
          transport::trace<transport::TracePoint::ht_combine_first_added>(b.team);
      }
      if (!ok) break;
      write_chunk(acc, out_row, bias_rows, offset / 16, min(kPieceBytes, row_bytes - offset) / 16);
    }
    if (ok) write_weights(a, t);
  }

  if (lane == 0) transport::trace<transport::TracePoint::ht_combine_last_added>(b.team);

  // The last CTA stores sequence = seq only once every rank is done: the copy kernel's CTAs read the old
  // value too, and each one that signals does so before the home rank reading its rows can be done.
  const bool last = signal_done(b, core::kCombineDone, seq, a.blocks_done, a.tokens_claimed);
  if (threadIdx.x == 0) transport::trace<transport::TracePoint::ht_combine_signalled>(b.team);
  if (last && wait_for_every_cta(b, core::kCombineDone, seq, transport::WaitPhase::ht_combine_done) &&
      threadIdx.x == 0) {
    *sequence = seq;
  }
  if (threadIdx.x == 0) transport::trace<transport::TracePoint::ht_combine_end>(b.team);
}

}  // namespace

void launch_combine(const CombineArgs& args, int num_blocks, cudaStream_t stream) {
  // Dependent behind the copy kernel (args.staged), which writes nothing this kernel reads in stream order.
  launch(combine_pull_kernel, dim3(num_blocks), dim3(kThreads), kStageBytes, stream, args.staged,
         "launching HT combine_pull_kernel", args);
}

void load_combine_kernel() {
  detail::allow_dynamic_shared_memory(reinterpret_cast<const void*>(combine_pull_kernel), kStageBytes,
                                      "cudaFuncSetAttribute(HT combine_pull_kernel)");
  detail::load_kernel(reinterpret_cast<const void*>(combine_pull_kernel), "HT combine kernel");
}

}  // namespace epx::kernels::ht
