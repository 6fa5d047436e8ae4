// What the LL dispatch's two steps share (dispatch.cu holds the protocol and the kernel; the send step is
// in dispatch_send.cuh, the receive step in dispatch_receive.cuh). Included by dispatch.cu only: its
// definitions have internal linkage, one copy in that translation unit.
#pragma once

#include <cstdint>

#include "core/ll_areas.hpp"
#include "kernels/common/grid.cuh"
#include "kernels/ll/ll_view.hpp"
#include "kernels/ll/protocol.cuh"

namespace epx::kernels::ll {
namespace {

constexpr int kThreads = 512;
static_assert(kThreads >= kMaxNvlinkRanks, "send() loads one rank's mask per thread");
constexpr int kWarps = kThreads / kWarp;
constexpr int kGroup = 128;  // columns per FP8 scale
// A send item is 8 lines of one token's row (protocol.cuh's items): for FP8, 7 whole scale groups.
constexpr int kItemGroups = kLinesPerItem * core::kLlLineDataBytes / kGroup;
static_assert(kItemGroups * kGroup == kLinesPerItem * core::kLlLineDataBytes, "an item holds whole FP8 groups");
constexpr int kLineBatch = 4;     // line instructions (16 lines) each receiving warp loads before it stores
constexpr int kEarlyEntries = 2;  // top-k entries each thread loads before its warp's first work (send)
constexpr int kStagedBatch = 8;   // top-k entries each thread loads together after those (send)
constexpr float kAmaxFloor = 1e-4f;
constexpr float kE4m3Max = 448.0f;

using core::LlHomeToken;
using core::LlWord;

// The call's rows as lines: FP8 H bytes, or BF16 2 H (send items of kLinesPerItem lines: by_row_items).
template <bool kFp8>
__device__ int row_bytes(const DispatchParams& p) {
  return kFp8 ? p.hidden : 2 * p.hidden;
}
template <bool kFp8>
__device__ int row_lines(const DispatchParams& p) {
  return core::ll_row_lines(row_bytes<kFp8>(p));
}

// The send step's work items (send): a routing item per token, then its row's send items.
__device__ inline int send_work(const DispatchParams& p) { return p.num_tokens * (1 + int(p.by_row_items.d)); }

// The order of the source ranks' blocks in each local expert's packed rows on receiver `me` (ll.hpp): me + 1,
// me + 2, ..., wrapping, me last. A message's row needs the counts of the sources before its own, and a
// rank's own messages are there long before its peers': so the peers' blocks come first, and at EP = 2 a
// peer's messages need no count at all.
__device__ inline int block_source(int position, int me, int R) {  // a rank where position < R
  const int s = me + 1 + position;
  return s >= R ? s - R : s;
}
__device__ inline int block_position(int s, int me, int R) {
  const int position = s - me - 1;
  return position < 0 ? position + R : position;
}

}  // namespace
}  // namespace epx::kernels::ll
