// Resolves the NVLink (LSA) address of every rank's copy of an NCCL symmetric window, so that kernels
// receive plain pointers instead of NCCL window handles.
#pragma once

#include <nccl.h>

#include <vector>

namespace epx::transport {

std::vector<void*> resolve_lsa_pointers(ncclWindow_t window, int nranks);

}  // namespace epx::transport
