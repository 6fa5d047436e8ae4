// Rank masking from the host (LlBuffer::set_rank_masked, clear_rank_mask): one small kernel, so that the
// change is ordered with the buffer's calls on the stream and capturable.
//
// Masking rank r sets rank_mask[r] and its host-mapped mirror (LlHostReport::masked) to 1.
// Unmasking r takes r to have made every call meanwhile (see ll.hpp): while r was masked nobody
// signalled across, so this rank's flags about r are behind; each of them is raised to this rank's own
// flag of the same op and set (atomicMax: r may already have signalled a later call), and only
// then is the mask cleared. The kernel runs after the buffer's earlier calls (stream order), so no
// kernel of this rank reads the flags or the mask meanwhile.
#include "core/cuda_check.hpp"
#include "kernels/ll/ll_view.hpp"

namespace epx::kernels::ll {
namespace {

__global__ void update_rank_mask_kernel(LlView v, int first, int last, bool masked) {
  const int me = v.team.rank;
  for (int r = first + int(threadIdx.x); r < last; r += int(blockDim.x)) {
    if (r == me) continue;
    uint32_t* mask = v.rank_mask_of(r);
    if (masked) {
      *mask = 1u;
      v.host_report->masked[r] = 1u;
      continue;
    }
    if (*mask == 0u) continue;
    for (int op = 0; op < core::kLlOps; ++op) {
      for (int set = 0; set < core::kLlSets; ++set) {
        const unsigned long long own = *v.freed_flag(me, op, set, me);
        atomicMax(reinterpret_cast<unsigned long long*>(v.freed_flag(me, op, set, r)), own);
      }
    }
    *mask = 0u;
    v.host_report->masked[r] = 0u;
  }
}

}  // namespace

void load_rank_mask_kernel() {
  detail::load_kernel(reinterpret_cast<const void*>(update_rank_mask_kernel), "LL rank mask kernel");
}

void launch_update_rank_mask(const LlView& view, int first, int last, bool masked, cudaStream_t stream) {
  update_rank_mask_kernel<<<1, kMaxNvlinkRanks, 0, stream>>>(view, first, last, masked);
  detail::check_launch("LL rank mask kernel");
}

}  // namespace epx::kernels::ll
