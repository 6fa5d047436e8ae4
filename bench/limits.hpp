// The physical limits of DESIGN.md §3, measured in the same run as every benchmark: what the
// bench's results are compared against.
#pragma once

#include <cstddef>
#include <string>

#include "bench/kernel_clock.hpp"
#include "bench/stamp_probe.hpp"
#include "epx/team.hpp"

namespace epx::bench {

// One dependent load's round trip, in ns, as the LL kernels poll: ld.relaxed.sys and ld.volatile.
struct LoadRoundTrip {
  double relaxed_sys = 0, volatile_load = 0;
};

// A burst of 128-byte lines stored to the next rank in one launch of the LL grid, as the LL kernels store
// them, timed as the LL calls are (limits.cu's line_burst); and the same lines loaded from the next rank's
// memory instead (line_pull), what a receiver that pulls its lines meets.
struct LineBurst {
  std::size_t bytes = 0;
  double us = 0;
  double pull_us = 0;
  double kernel_us = 0;  // the stored burst's kernel time (KernelClock), as the LL rows' kernel_us; 0: not measured
};

// A kernel of the LL grid in which one thread stores a word into the next rank's memory and waits for the
// previous rank's word, captured in a graph and timed as the LL calls are (limits.cu's handshake): the floor
// under an LL call that needs anything from a peer. Its clock stamps give how far apart the ranks' kernels
// start after the bench's team barrier, without a shared clock: a rank's wait lasts the previous rank's start
// minus its own, plus the hop.
struct Handshake {
  double us = 0;               // timed as the LL calls are: the slowest rank's median
  double wait_us[2] = {0, 0};  // ranks 0 and 1: the median of a rank's wait, from its kernel's start
  // The median over the timed replays of the largest (wait - relaxed_word_latency_us) over the ranks: with 2 ranks
  // how much later the later rank's kernel started; with more, a lower bound on the latest start minus the
  // earliest (each rank sees only the previous rank's start).
  double start_skew_us = 0;
};

struct Limits {
  bool measured_nvlink = false;     // needs at least 2 ranks on separate GPUs
  double nvlink_sm_store_gbps = 0;  // 16-byte stores, every rank writing to the next at once, per direction
  int nvlink_sm_store_blocks = 0;   // CTAs used for that
  double nvlink_sm_store_16_blocks_gbps = 0;
  double nvlink_copy_engine_gbps = 0;     // cudaMemcpyAsync to the peer, every rank at once, per direction
  double nvlink_pull_gbps = 0;            // bulk loads from the next rank into one CTA per SM (as the HT combine
                                          // pulls), every rank at once, per direction
  double nvlink_pull_16_blocks_gbps = 0;  // the same into 16 CTAs
  // Both at once, half the bytes each: 16 CTAs pulling and the copy engine storing to the next rank.
  double nvlink_pull_16_blocks_beside_copy_engine_gbps = 0;
  double flag_latency_us = 0;               // one way, rank 0 <-> rank 1 ping-pong of release stores
  double relaxed_word_latency_us = 0;       // the same with relaxed stores (as stamped data and the handshake go)
  double one_kernel_graph_us = 0;           // a graph of one empty kernel, timed as the LL calls are
  double one_kernel_graph_in_a_row_us = 0;  // the same graph, timed as the LL calls in a row are
  double one_kernel_in_one_graph_us = 0;    // an empty kernel's share of a graph of them, as the LL calls in one graph
  double one_kernel_graph_kernel_us = 0;    // its kernel time (KernelClock), as the LL rows' kernel_us; 0: not measured
  double hbm_copy_gbps = 0;                 // device-to-device copy, bytes read + written
  LoadRoundTrip load_private_ns;            // a word of cudaMalloc memory
  LoadRoundTrip load_own_symmetric_ns;      // a word of this rank's symmetric memory, at the address kernels use
  LoadRoundTrip load_peer_symmetric_ns;     // a word of the next rank's symmetric memory (over NVLink)
  bool data_checked = false;                // every byte the NVLink tests moved was compared on the GPU
  StampProbe stamps;                        // whether stamped stores arrive whole over NVLink (stamp_probe.cu)
  StampProbe stamps_same_gpu;               // and from a rank to its own memory
  StampProbe stamps_pulled;                 // and to a rank's own memory, read by the previous rank over NVLink
  // About the LL dispatch's payload to a peer at the default shape (1.0 MB) and its combine's (1.9 MB).
  LineBurst line_bursts[2] = {{std::size_t(1) << 20}, {std::size_t(2) << 20}};
  Handshake handshake;
};

// Collective over the team (one process per GPU). Ranks other than 0 return what they measured too.
// `kernel_clock` (open_kernel_clock's; may be null): the kernel times too.
Limits measure_limits(Team& team, KernelClock* kernel_clock);

}  // namespace epx::bench
