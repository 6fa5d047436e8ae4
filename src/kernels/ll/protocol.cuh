// The flag protocol both LL kernels share (the "freed" flags of core::LlAreas; each kernel's header says
// what the data behind them is). Per (op, set) every flag holds the sequence number of a call (they only grow):
//   * A call's sequence number on a set is seq = freed(me, op, set, me) + 1: this rank's own receive
//     steps on the set so far, plus one (read when a kernel starts; the receive step of the previous
//     call on the set has finished by then, see ll.hpp's rules).
//   * Before a warp first writes into peers' copies of the set, it waits until every peer's
//     freed(me, op, set, peer) >= seq - 1: the peer has finished reading the set's previous use, so
//     nothing unread is overwritten, whatever the order of calls (captured graphs included). The flags
//     are loaded when the kernel starts; in teams of up to 32 ranks (a lane each) the wait happens only
//     if those loads fell short (SetFree); larger teams always wait (wait_set_free).
//   * There is no "ready" flag: the data carries the call's stamp ll_stamp(seq), the dispatch's routing
//     in stamped words (core::LlWord), the dispatch's payloads and the combine's rows in lines
//     (core::kLlLineBytes), and a receive step waits for the stamps of what it reads (wait_for_words).
//   * When every CTA's reads are done, freed(r, op, set, me) = seq on every rank r (me included): the
//     receive step's CTA that counts itself last (FreedRecord) sets its own, freed(me, op, set, me) (the
//     next call's sequence number reads it; later kernels only), and records the call in
//     pending_freed[op]; the peers' go out at the start of this rank's next kernel of the op
//     (signal_pending_freed), once this kernel and its reads are complete. So a receive step ends with neither a fence
//     nor a remote store: its reads are complete once its kernel is, and nothing else needs ordering
//     before the signals. A peer waits for such a signal only two calls of the op later (above), by
//     which time this rank has started the call in between whenever the peer's calls depended on it
//     (every dispatch waits for every peer's counts of the same call); otherwise the wait lasts until
//     this rank starts its next call of the op (ll.hpp's rules).
// Signals are system-scope stores by one thread, relaxed: what a "freed" signal vouches for, this rank's
// reads of the set, ended with an earlier kernel (a grid's accesses are complete when it ends, before the
// next kernel of the stream starts), so a release would order nothing (its fence only held up the
// signalling thread at its kernel's start). Waits are acquires, bounded (wait_at_least), except the
// set-free check's early loads, which go through L1 (load_through_l1; SetFree says why).
// One remote signal per call and peer: many CTAs adding to one remote counter serialise on it.
//
// Rank masking (rank_mask, written by the host through LlBuffer::set_rank_masked, or by a wait on that
// rank that expired with mask_on_timeout): a masked rank is sent nothing, signalled nothing and waited for
// never, and what it wrote is not read; a dispatch whose sends see it masked counts its experts as -1.
// Kernels read the mask with relaxed loads where they use it. A rank masked while a call runs (by an
// expiry, seconds into it) may be used by some parts of that call and skipped by others; calls that
// start after the masking see it everywhere. A freed signal follows the mask of the moment it goes out
// (the next call's start): a call made while r was masked signals r if r is unmasked by then, which
// rank_mask.cu's unmasking (atomicMax) allows for.
#pragma once

#include <cstdint>

#include "kernels/common/grid.cuh"
#include "kernels/ll/ll_view.hpp"
#include "transport/device/phase_trace.hpp"
#include "transport/device/wait.cuh"

namespace epx::kernels::ll {

// A load the SM's L1 may serve (ld.ca), for the flag words every warp of a kernel reads when it starts:
// its call's sequence number and the peers' "freed" flags. Loads that bypass L1 (relaxed.sys, volatile)
// of one word all go to the L2 slice that holds it, one request per warp: with the default grid (132 CTAs
// of 16 warps) ~4,000 requests in a row at every kernel's start, which the first loads of every warp wait
// behind. Through L1, an SM's first request fetches the line and its other warps share it. The driver
// invalidates L1 between dependent grids (PTX ISA, cache operators), so the value is at least as new as
// the line was when this SM first fetched it in this kernel: a word written by an earlier kernel of this
// rank is seen (the sequence number), and a "freed" flag, which only grows, may be seen too low, which
// sends the warp to the acquire wait (ensure_set_free).
__device__ __forceinline__ uint64_t load_through_l1(const uint64_t* p) {
  uint64_t value;
  asm volatile("ld.global.ca.u64 %0, [%1];" : "=l"(value) : "l"(p) : "memory");
  return value;
}

// The sequence number of the call being made on (op, set).
__device__ inline uint64_t call_sequence(const LlView& v, int op, int set) {
  return load_through_l1(v.freed_flag(v.team.rank, op, set, v.team.rank)) + 1;
}

// Whether this rank no longer exchanges with rank r (rank masking, above).
__device__ inline bool is_masked(const LlView& v, int r) {
  return transport::load_relaxed_sys(v.rank_mask_of(r)) != 0u;
}

enum class PeerWait { arrived, masked, failed };

// A bounded wait for peer r, skipped when r is masked: wait(give_up) is a transport wait (spin_until or
// its forms) given r's rank mask as give_up under mask_on_timeout. Then a wait on another rank that
// expires masks it (rank_mask and its host mirror) instead of failing the team, and a wait also ends
// when r gets masked meanwhile. `failed`: the team failed. kWholeWarp: as transport::spin_until's (the
// whole warp calls it and gets the same answer: lane 0's decisions).
template <bool kWholeWarp = false, typename Wait>
__device__ PeerWait wait_for_peer_with(const LlView& v, int r, Wait wait) {
  if (transport::warp_wide<kWholeWarp>(is_masked(v, r))) return PeerWait::masked;
  uint32_t* give_up = v.mask_on_timeout && r != v.team.rank ? v.rank_mask_of(r) : nullptr;
  if (wait(give_up)) return PeerWait::arrived;
  if (transport::warp_wide<kWholeWarp>(give_up == nullptr || team_failed(v.team))) return PeerWait::failed;
  atomicExch(&v.host_report->masked[r], 1u);
  return PeerWait::masked;
}

// wait_for_peer_with until *flag >= expected.
__device__ inline PeerWait wait_for_peer(const LlView& v, int r, const uint64_t* flag, uint64_t expected,
                                         transport::WaitSite site) {
  const bool masked = is_masked(v, r);  // both loads in flight at once
  const bool here = transport::load_acquire_sys(flag) >= expected;
  if (masked) return PeerWait::masked;
  if (here) return PeerWait::arrived;
  return wait_for_peer_with(
      v, r, [&](uint32_t* give_up) { return transport::wait_at_least(v.team, flag, expected, site, give_up); });
}

// Stamped words (core::LlWord): one 8-byte access each, volatile, so that a spin reloads them; a word is
// whole (single-copy atomic), so its stamp vouches for its data.
__device__ __forceinline__ void store_word(core::LlWord* p, core::LlWord a) {
  asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(p), "l"(a) : "memory");
}
__device__ __forceinline__ core::LlWord load_word(const core::LlWord* p) {
  core::LlWord a;
  asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(a) : "l"(p) : "memory");
  return a;
}

// Line vectors (core::kLlLineBytes): 16-byte volatile accesses; a warp stores a line's 8 with one
// instruction (8 lanes), and a reader takes the line once its stamp vector shows the call's stamp.
__device__ __forceinline__ void store_vector(uint4* p, uint4 a) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w)
               : "memory");
}
__device__ __forceinline__ uint4 load_vector(const uint4* p) {
  uint4 a;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(a.x), "=r"(a.y), "=r"(a.z), "=r"(a.w)
               : "l"(p)
               : "memory");
  return a;
}

// The warp's first of `items` work items dealt to the warps of a grid of `warps_per_cta`-warp CTAs, the
// warp's CTA at position `cta` of the grid (a kernel may count the CTAs from either end). Where the items
// fit in one warp per CTA, item i goes to warp `lone_warp` of the CTA at position i, one per SM: an SM's
// load bandwidth and issue slots are shared by its warps (a warp alone on its SM does a combine item's
// loads and sums in ~0.40 us, 16 warps of one SM in ~0.65: epx-start-probe), and a CTA's barriers wait
// for its slowest warp. Otherwise they fill the CTAs in turn (cta * warps_per_cta + warp); dealing them
// over the CTAs first at every size cost T = 128 0.2 us (combine) and 0.9 us (dispatch), where every warp
// has an item either way. (The dispatch's receive items, which do not use this, are dealt over the CTAs
// first: dispatch_receive.cuh says why.) Returns `items` (none) for the other warps of a CTA in the first case.
__device__ __forceinline__ int first_work_item(int items, int cta, int lone_warp, int warps_per_cta) {
  const int warp = int(threadIdx.x / kWarp);
  if (items <= int(gridDim.x)) return warp == lone_warp ? cta : items;
  return cta * warps_per_cta + warp;
}

// The first CTA of the grid none of whose warps takes one of `items` work items dealt by first_work_item
// counting the CTAs from the grid's start; gridDim.x where every CTA takes some.
__device__ __forceinline__ int first_idle_cta(int items, int warps_per_cta) {
  if (items <= int(gridDim.x)) return items;
  return min((items + warps_per_cta - 1) / warps_per_cta, int(gridDim.x));
}

// A warp moves lines in line instructions of 4 lines: lane i holds vector i % 8 of line 4 k + i / 8 of
// instruction k (vector 7 is the stamp vector, its first word the stamp), so one store instruction
// writes 4 whole lines. Both kernels' line work items (dispatch's send items, combine's items) are 8
// lines of a row (instructions 2 g and 2 g + 1); data vector v < 7 of line l holds row bytes
// [112 l + 16 v, +16).
constexpr int kLinesPerInstruction = 4, kLinesPerItem = 8;
constexpr int kDataVectors = core::kLlLineVectors - 1;  // vector 7 of a line is its stamp vector
__device__ __forceinline__ int line_vector() { return int(threadIdx.x % kWarp) % core::kLlLineVectors; }
__device__ __forceinline__ int instruction_line(int k) {
  return kLinesPerInstruction * k + int(threadIdx.x % kWarp) / core::kLlLineVectors;
}
__device__ __forceinline__ int item_line(int g, int j) { return instruction_line(2 * g + j); }
// The row byte of this lane's data vector in line `line`.
__device__ __forceinline__ int line_byte(int line) {
  return core::kLlLineDataBytes * line + int(sizeof(uint4)) * line_vector();
}
// The line instructions and the work items of a row of `lines` lines (host and device code).
constexpr int line_instructions(int lines) { return (lines + kLinesPerInstruction - 1) / kLinesPerInstruction; }
constexpr int line_items(int lines) { return (lines + kLinesPerItem - 1) / kLinesPerItem; }
// The stamp of the line whose vector this lane holds in x (the whole warp calls it).
__device__ __forceinline__ uint32_t line_stamp(const uint4& x) {
  return __shfl_sync(~0u, x.x, int(threadIdx.x % kWarp) | (core::kLlLineVectors - 1));
}

// Whether line instruction k, of a run that ends at instruction `end` of a row of `lines` lines, holds a
// line for this lane (one of the row's, not past it).
__device__ __forceinline__ bool instruction_has_line(int k, int end, int lines) {
  return k < end && instruction_line(k) < lines;
}

// Stores this lane's vectors x[b] of instructions first + b (those whose line is below `lines`) into
// `row`; the caller has put each line's stamp vector in x on lanes 8 m + 7.
template <int N>
__device__ void store_lines(uint4* row, int first, int lines, const uint4 (&x)[N]) {
  __syncwarp();  // a line's 8 vectors in one store instruction
#pragma unroll
  for (int b = 0; b < N; ++b) {
    const int line = instruction_line(first + b);
    if (line < lines) store_vector(row + line * core::kLlLineVectors + line_vector(), x[b]);
  }
}

// Loads this lane's vectors of instructions first .. first + N - 1 of `row` (those below `end` whose
// line is below `lines`) into x. Uses none of them: a caller may issue other loads before it checks them
// (lines_carry), so that their round trips overlap.
template <int N>
__device__ void issue_lines(const uint4* row, int first, int end, int lines, uint4 (&x)[N]) {
  __syncwarp();  // a line's 8 vectors in one load instruction, so the stamp vouches for the data
#pragma unroll
  for (int b = 0; b < N; ++b) {
    if (instruction_has_line(first + b, end, lines))
      x[b] = load_vector(row + instruction_line(first + b) * core::kLlLineVectors + line_vector());
  }
}

// On every lane: whether each line issue_lines loaded into x (the same first, end and lines) carries `stamp`.
template <int N>
__device__ bool lines_carry(const uint4 (&x)[N], int first, int end, int lines, uint32_t stamp) {
  bool here = true;
#pragma unroll
  for (int b = 0; b < N; ++b) {
    const uint32_t seen = line_stamp(x[b]);  // on every lane: a shuffle
    here = here && (!instruction_has_line(first + b, end, lines) || seen == stamp);
  }
  return __all_sync(~0u, here);
}

// issue_lines, then lines_carry.
template <int N>
__device__ bool load_lines(const uint4* row, int first, int end, int lines, uint32_t stamp, uint4 (&x)[N]) {
  issue_lines(row, first, end, lines, x);
  return lines_carry(x, first, end, lines, stamp);
}

// For a wait's report (the whole warp): the stamp of the first line in x (as load_lines left it) that
// does not carry `stamp`, or `stamp` if none.
template <int N>
__device__ uint32_t first_missing_stamp(const uint4 (&x)[N], int first, int end, int lines, uint32_t stamp) {
  uint32_t seen = stamp;
#pragma unroll
  for (int b = 0; b < N; ++b) {
    const uint32_t line_seen = line_stamp(x[b]);
    const uint32_t missing = __ballot_sync(~0u, instruction_has_line(first + b, end, lines) && line_seen != stamp);
    if (missing != 0u && seen == stamp) seen = __shfl_sync(~0u, line_seen, __ffs(missing) - 1);
  }
  return seen;
}

// This thread waits (wait_for_peer_with) until arrived(), which loads stamped words (or lines) of source
// s into the caller's variables and says whether each carries the call's stamp; last_seen() is the word
// to report if not. Nothing needs an acquire: each word (line) vouches for its own data. kWholeWarp
// (lines): the whole warp calls it, arrived() may use warp collectives and returns the same on
// every lane, and so does the wait (transport::spin_until's kWholeWarp). A wait (arrived() false at
// first) adds its cycles to v.wait_cycles[s] where the call asked for them (one add per warp or thread).
template <bool kWholeWarp = false, typename Arrived, typename LastSeen>
__device__ PeerWait wait_for_words(const LlView& v, int s, uint32_t stamp, Arrived arrived, LastSeen last_seen,
                                   transport::WaitSite site) {
  if (arrived()) return PeerWait::arrived;
  const long long start = clock64();
  const PeerWait got = wait_for_peer_with<kWholeWarp>(v, s, [&](uint32_t* give_up) {
    return transport::spin_until<kWholeWarp>(v.team, arrived, core::stamped(stamp, 0), last_seen, site, give_up);
  });
  if (v.wait_cycles != nullptr && (!kWholeWarp || threadIdx.x % kWarp == 0)) {
    atomicAdd(v.wait_cycles + s, static_cast<unsigned long long>(clock64() - start));
  }
  return got;
}

// The whole warp waits (wait_for_words) until instructions [first, end) of `row`, from source s, carry
// `stamp`, loading them into x (load_lines); a report names the first line stamp missing.
template <int N>
__device__ PeerWait wait_for_lines(const LlView& v, int s, const uint4* row, int first, int end, int lines,
                                   uint32_t stamp, uint4 (&x)[N], transport::WaitSite site) {
  return wait_for_words<true>(
      v, s, stamp, [&] { return load_lines(row, first, end, lines, stamp, x); },
      [&] { return core::stamped(first_missing_stamp(x, first, end, lines, stamp), 0u); }, site);
}

// The whole warp waits until every peer has freed `set` of `op` after its previous use. Returns false
// on every lane when the team failed.
__device__ inline bool wait_set_free(const LlView& v, int op, int set, uint64_t seq) {
  bool ok = true;
  for (int r = threadIdx.x % kWarp; r < v.team.nranks; r += kWarp) {
    const auto freed = v.freed_flag(v.team.rank, op, set, r);
    ok = ok &&
         wait_for_peer(v, r, freed, seq - 1,
                       transport::WaitSite{transport::WaitPhase::ll_set_reuse, r, uint32_t(set)}) != PeerWait::failed;
  }
  return __all_sync(~0u, ok);
}

// A warp's state of the "set is free" wait (ensure_set_free). `early`: lane r < R's load of freed(me, op,
// set, r) made when the kernel starts (load_set_free), so that its round trip hides behind the kernel's
// first loads instead of delaying the warp's first remote store (an acquire load would hold back the
// loads after it), through L1 (load_through_l1). A load without ordering is enough, as the signal is
// relaxed (above): the flag speaks for a peer's reads that ended with an earlier kernel of the peer, and a
// store issued after the load has returned and been compared cannot reach them, as a GPU performs no
// store speculatively.
struct SetFree {
  uint64_t early;
  bool seen;  // the warp has seen every peer free the set
};

__device__ inline SetFree load_set_free(const LlView& v, int op, int set) {
  const int r = threadIdx.x % kWarp;
  return SetFree{r < v.team.nranks ? load_through_l1(v.freed_flag(v.team.rank, op, set, r)) : ~0ull, false};
}

// Before a warp's first remote store of a call: whether the early loads already show every peer free
// (teams of up to 32 ranks: a lane each), else wait_set_free; the phase trace's kSeen point when the warp
// first sees it. Returns false on every lane when the team failed.
template <transport::TracePoint kSeen>
__device__ inline bool ensure_set_free(const LlView& v, int op, int set, uint64_t seq, SetFree& free) {
  if (!free.seen) {
    free.seen = (v.team.nranks <= kWarp && __all_sync(~0u, free.early >= seq - 1)) || wait_set_free(v, op, set, seq);
    if (free.seen && threadIdx.x % kWarp == 0) transport::trace<kSeen>(v.team);
  }
  return free.seen;
}

// The record of a receive step of call seq on (op, set): this rank's own freed(me, op, set, me) = seq (the
// set's sequence number for the next call on it, call_sequence) and pending_freed[op] for
// signal_pending_freed. Only later kernels read either word (a grid's accesses are complete when it
// ends), so the record may be written before this kernel's reads of the set are over; but not before
// every CTA of the kernel has read freed(me, op, set, me) for its own sequence number. So each CTA counts
// itself (count, thread 0) in blocks_done[op] (the step's private counter, zero between
// kernels) once every thread of the CTA has passed a barrier after that read, and the CTA that counts last
// writes the record (record_if_last), unless the team had failed when it counted, and resets the counter:
// the dispatch at the end of its work, the combine as soon as its count is back (combine.cu says why). The
// count is relaxed: the reads are performed before the barrier, and the count after it, on the hardware.
// Counted at the start, the count's round trip hides behind the CTA's work: counted at the end (until
// 2026-11-28), it came after every CTA's last read, and the last CTA's round trip ended the kernel ~0.6 us
// after its last receive (phase trace, T = 128).
struct FreedRecord {
  int op;
  uint32_t before = 0;  // thread 0: the count before this CTA's
  bool failed = false;  // thread 0: the team had failed when the CTA counted
  __device__ void count(const LlView& v) {
    if (threadIdx.x != 0) return;
    failed = team_failed(v.team);
    before = transport::add_relaxed_gpu(v.blocks_done_of(op), 1u);
  }
  __device__ void record_if_last(const LlView& v, int set, uint64_t seq) const {
    if (threadIdx.x != 0 || before != gridDim.x - 1) return;
    *v.blocks_done_of(op) = 0;
    if (failed) return;
    *v.freed_flag(v.team.rank, op, set, v.team.rank) = seq;
    *v.pending_freed_of(op) = (seq << 1) | uint64_t(set);
  }
};

// One thread of every kernel of op, first (thread 0 of the second-to-last CTA, before that CTA's work:
// the last one sends the dispatch's counts and takes the combine's first receive items): takes the record
// of the op's receive step that an earlier kernel left (FreedRecord) and clears it, in one
// atomic exchange, then sends its "freed" signals to every peer not masked now. Kernels of one op on a
// buffer never overlap (calls are stream-ordered, and a graph captures them in order). This kernel's own
// record, if any, is written by the CTA that counts itself last, after every CTA's count, and this
// thread's exchange is performed before it counts its CTA (it branches on the exchange's value first), so
// the exchange cannot clear it: an ordering of the hardware, not of the PTX memory model (both atomics
// are relaxed).
__device__ inline void signal_pending_freed(const LlView& v, int op) {
  const uint64_t pending = atomicExch(reinterpret_cast<unsigned long long*>(v.pending_freed_of(op)), 0ull);
  if (pending == 0 || team_failed(v.team)) return;
  const int set = int(pending & 1u);
  for (int r = 0; r < v.team.nranks; ++r) {
    if (r == v.team.rank || is_masked(v, r)) continue;
    transport::store_relaxed_sys(v.freed_flag(r, op, set, v.team.rank), pending >> 1);  // relaxed: above
  }
}

// What every LL kernel of op does before it touches the set: thread 0 of the second-to-last CTA (the last
// one sends the dispatch's counts and takes the combine's first receive items) sends the freed signals
// an earlier kernel left (signal_pending_freed); every thread gets the call's sequence number. The
// dispatch issues its first rows' loads before this (send), so that their round trips overlap.
__device__ inline uint64_t begin_call(const LlView& v, int op, int set) {
  if (int(blockIdx.x) == max(int(gridDim.x) - 2, 0) && threadIdx.x == 0) signal_pending_freed(v, op);
  return call_sequence(v, op, set);
}

}  // namespace epx::kernels::ll
