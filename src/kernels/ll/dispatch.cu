// LL dispatch: one dedup message per (token, destination rank), written straight into the
// destination's receive area; each receiver then expands the messages into the caller's packed layout.
//
// Protocol, for buffer set `set` (areas of core::LlAreas; the sequence number seq and the "set is free"
// wait as in protocol.cuh). Everything a source writes into a destination's areas carries the call's
// stamp ll_stamp(seq): the routing as stamped words (core::LlWord), the payloads as lines
// (core::kLlLineBytes, a warp's store instruction writing 4 whole lines), so a receiver takes each word
// or line once it carries this call's stamp: there is no "ready" flag, no fence and no count before the
// receive can start.
//   Send (rank me). Every CTA first stages my top-k table in shared memory (int16, -1 for none, an
//   invalid id or an expert of a masked rank; CTA 0 records the first invalid id). A warp waits until the
//   peers have freed the set before its first remote store.
//     * Counts and manifests (the last CTA, before its items): expert_counts(r, set, me) = my tokens
//       per local expert of r; manifest(r, set, me) word j, bit i: my token 32 j + i sends r a
//       message (every word, for every rank r not masked).
//     * Routing items (a warp per token t): header(r, set, me, t) for every destination rank r of t:
//       slots, unique_slots, and per slot the expert, weight and block_row (how many of my tokens
//       before t name that expert: t's place among them); and home(set, t) (t's destination ranks
//       ascending and valid slots, for combine).
//     * Send items (a warp per token t and 8 lines of its row): payload(r, set, me, t) = the row as
//       lines (BF16, or FP8 cast once here with its group scales in the stamp vectors) for every
//       destination rank r of t.
//     All of them plain volatile stores over NVLink (8-byte words, 16-byte line vectors), in no order.
//   Receive (rank me). A source masked in the CTA's view of the mask (taken when the send step starts in a
//   launch with both steps, else when the receive step starts; a masked source counts as having sent nothing,
//   see protocol.cuh) is not read. Warps take (message, part of its payload) work items. Message (s, t): the
//   warp waits for manifest word t / 32 of s and, if t's bit is set (else t sent me nothing), the header's
//   words, in one wait; then for the counts expert_counts(me, set, s')[e] of each of its slots' experts e and
//   every unmasked s' whose block comes before s's: expert e's rows are source blocks in the order me + 1,
//   me + 2, ..., wrapping, me last (block_source), tokens ascending within a block, so the message goes to row
//   begin(e, s) + block_row of every unique slot naming e, begin(e, s) being the sum of those counts.
//   Then it waits for the payload lines of its part, and stores the part into every row (FP8: the scales
//   too); src_idx too. The part's loads (manifest word, header, first payload lines) all go out before the
//   first wait: a word or line loaded early vouches for itself as well.
//   The last CTA writes layout_range, recv_count and the statistics (waiting for every source's counts;
//   its receive items, dealt over the CTAs first like every CTA's, wait behind them; in a launch with the
//   sends it has sent the counts and manifests first). What combine needs of each
//   message (slots, each slot's packed row and weight; slots 0 for a token that sent nothing) is kept in
//   private memory, so the set is not read after this step. Then the CTA that counted itself last records the call as
//   freed (FreedRecord); the signals go out at the start of this rank's next dispatch (protocol.cuh). Every wait is
//   bounded (wait_for_words).
#include <algorithm>

#include "core/cuda_check.hpp"
#include "kernels/common/launch.hpp"
#include "kernels/ll/dispatch_receive.cuh"
#include "kernels/ll/dispatch_send.cuh"
#include "kernels/ll/dispatch_shared.cuh"
#include "transport/device/phase_trace.hpp"

namespace epx::kernels::ll {
namespace {

// kFp8: p.fp8, a kernel of its own for each payload format (with one kernel for both, the BF16 calls
// took ~0.5 us longer once the FP8 receive got cheaper, from the code the compiler made for the pair).
template <bool kFp8>
__global__ void __launch_bounds__(kThreads) dispatch_kernel(DispatchParams p) {
  wait_for_prior_grid();  // a programmatic dependent (launch_dispatch): no access before this
  if (threadIdx.x % kWarp == 0) transport::trace<transport::TracePoint::ll_dispatch_start>(p.v.team);
  __shared__ bool masked[kMaxNvlinkRanks];  // the CTA's view of the mask: see send and receive
  const uint64_t seq = p.phases & kSend ? send<kFp8>(p, masked) : begin_call(p.v, core::kLlDispatch, p.set);
  if (p.phases & kReceive) receive<kFp8>(p, seq, masked);
  if (threadIdx.x == 0) transport::trace<transport::TracePoint::ll_dispatch_end>(p.v.team);
}

}  // namespace

constexpr std::size_t kMaxSendShared =
    (std::size_t(core::kLlMaxTokens) * core::kLlMaxTopk * sizeof(int16_t)) + core::kLlMaxExperts * sizeof(int32_t);

void load_dispatch_kernel() {
  const auto load = [](const void* kernel, const char* what) {
    detail::allow_dynamic_shared_memory(kernel, int(kMaxSendShared), what);
    detail::load_kernel(kernel, what);
  };
  load(reinterpret_cast<const void*>(dispatch_kernel<true>), "LL dispatch kernel (FP8)");
  load(reinterpret_cast<const void*>(dispatch_kernel<false>), "LL dispatch kernel (BF16)");
}

// The parts a received message of `lines` lines is cut into: so that every warp of the grid has about one
// work item (at most 8, and no more than the payload's line instructions).
static int receive_parts(const DispatchParams& p, int lines, int num_blocks) {
  const int messages = p.v.team.nranks * p.v.max_tokens;
  return std::max(1, std::min(std::min(num_blocks * kWarps / messages, 8), line_instructions(lines)));
}

void launch_dispatch(const DispatchParams& params, int num_blocks, cudaStream_t stream) {
  DispatchParams p = params;
  p.by_topk = core::Divisor::of(uint32_t(std::max(p.topk, 1)));
  const int lines = core::ll_row_lines(p.fp8 ? p.hidden : 2 * p.hidden);  // as row_lines<kFp8> on the device
  p.by_row_items = core::Divisor::of(uint32_t(line_items(lines)));
  const int parts = receive_parts(p, lines, num_blocks);
  p.by_receive_parts = core::Divisor::of(uint32_t(parts));
  p.part_instructions = (line_instructions(lines) + parts - 1) / parts;
  const std::size_t shared = (p.phases & kSend) == 0 ? 0
                                                     : experts_table_bytes(p.num_tokens, p.topk) +
                                                           std::size_t(p.v.num_experts) * sizeof(int32_t);
  // A programmatic dependent (launch.hpp) of the kernel before it, a caller's or our combine's: in a CUDA
  // graph its CTAs start as that kernel's last ones exit (outside one, CallOrder's event wait sits between
  // them). The LL kernels never allow their own dependents earlier (allow_dependent_launch): a next
  // kernel's waiting CTAs could keep out a CTA of another rank's kernel on a single-GPU team, which this
  // kernel's waits may need.
  launch(p.fp8 ? dispatch_kernel<true> : dispatch_kernel<false>, dim3(num_blocks), dim3(kThreads), shared, stream, true,
         "launching LL dispatch kernel", p);
}

}  // namespace epx::kernels::ll
