#include "bench/limits.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "bench/device_data.hpp"
#include "bench/ll_bench.hpp"
#include "bench/team_sync.hpp"
#include "bench/timing.hpp"
#include "core/cuda_check.hpp"
#include "kernels/common/bulk_copy.cuh"
#include "kernels/ll/protocol.cuh"
#include "transport/device/wait.cuh"
#include "transport/team_impl.hpp"

namespace epx::bench {
namespace {

using detail::check_cuda;
using transport::TeamView;

constexpr std::size_t kBytes = std::size_t(256) << 20;  // per rank and direction: far past L2
constexpr int kPingPongs = 10000;

__global__ void fill_pattern(uint32_t* data, std::size_t words, uint32_t seed) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < words;
       i += std::size_t(gridDim.x) * blockDim.x) {
    data[i] = uint32_t(i) * 2654435761u ^ seed;
  }
}

__global__ void count_mismatches(const uint32_t* data, std::size_t words, uint32_t seed, unsigned long long* bad) {
  unsigned long long mine = 0;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < words;
       i += std::size_t(gridDim.x) * blockDim.x) {
    mine += data[i] != (uint32_t(i) * 2654435761u ^ seed);
  }
  if (mine != 0) atomicAdd(bad, mine);
}

__global__ void store_copy(const int4* __restrict__ src, int4* dst, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    dst[i] = src[i];
  }
}

__global__ void empty_kernel() {}

// The LL kernels' way of storing to a peer, alone: `items` items of 8 lines of 128 bytes (1 KiB) at dst,
// item i on warp i % 16 of CTA i / 16 (and i + warps, ...), as the LL dispatch deals its send items; each
// item as two store instructions of the warp, 4 whole lines (512 contiguous bytes) each, through
// kernels::ll::store_vector.
constexpr int kBurstItemLines = 8;
constexpr std::size_t kBurstItemBytes = kBurstItemLines * core::kLlLineBytes;
constexpr int kBurstItemInstructions = kBurstItemLines * core::kLlLineVectors / kernels::kWarp;  // per item, a warp's

// The vector this lane stores or loads with instruction k of item i.
__device__ int burst_vector(int i, int k) {
  return (i * kBurstItemInstructions + k) * kernels::kWarp + int(threadIdx.x % kernels::kWarp);
}

__global__ void __launch_bounds__(512) line_burst(uint4* dst, int items) {
  const int warps_per_cta = blockDim.x / kernels::kWarp;
  for (int i = blockIdx.x * warps_per_cta + threadIdx.x / kernels::kWarp; i < items; i += gridDim.x * warps_per_cta) {
    for (int k = 0; k < kBurstItemInstructions; ++k) {
      kernels::ll::store_vector(dst + burst_vector(i, k), make_uint4(i, k, threadIdx.x % kernels::kWarp, 0));
    }
  }
}

// The same items loaded from src (the next rank's memory) instead, with the LL kernels' loads
// (kernels::ll::load_vector); a warp folds what it loaded into one word, stored only if it matches `never`
// (so that no load is dropped).
__global__ void __launch_bounds__(512) line_pull(const uint4* src, int items, uint32_t never, uint32_t* sink) {
  const int warps_per_cta = blockDim.x / kernels::kWarp;
  uint32_t folded = 0;
  for (int i = blockIdx.x * warps_per_cta + threadIdx.x / kernels::kWarp; i < items; i += gridDim.x * warps_per_cta) {
    uint4 v[kBurstItemInstructions];
#pragma unroll
    for (int k = 0; k < kBurstItemInstructions; ++k) v[k] = kernels::ll::load_vector(src + burst_vector(i, k));
#pragma unroll
    for (int k = 0; k < kBurstItemInstructions; ++k) folded ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  }
  if (folded == never) sink[threadIdx.x] = folded;
}

// The HT combine's way of reading a peer (src/kernels/ht/combine.cu), alone: `pieces` pieces of
// kPullPieceBytes from `src` (the next rank's memory), dealt to the warps in turn; each warp's lane 0
// keeps kPullSlots - 1 of its pieces loading by bulk loads into its own slots, and the lanes fold each
// piece that lands into a word, stored only if it matches `never` (so that no load is dropped). As in the
// combine, lane 0 reloads a slot only after __syncwarp has followed every lane's reads of it, and a proxy
// fence orders those reads before the copy engine's writes. Unlike it, every piece is remote: this is
// what the combine's grid could pull if it had nothing else to do.
constexpr int kPullWarps = 20, kPullSlots = 5, kPullPieceBytes = 2048;
constexpr int kPullStageBytes = kPullWarps * kPullSlots * kPullPieceBytes;

__global__ void __launch_bounds__(kPullWarps* kernels::kWarp, 1)
    bulk_pull(TeamView team, const uint8_t* src, std::size_t pieces, uint32_t never, uint32_t* sink) {
  extern __shared__ __align__(128) uint8_t pull_stage[];  // [warp][slot][kPullPieceBytes]
  __shared__ uint64_t landed_of[kPullWarps][kPullSlots];  // mbarriers: a slot's piece has landed
  const int warp = threadIdx.x / kernels::kWarp, lane = threadIdx.x % kernels::kWarp;
  uint64_t* landed = landed_of[warp];
  uint8_t* slots = pull_stage + warp * kPullSlots * kPullPieceBytes;
  if (lane == 0) {
    for (int s = 0; s < kPullSlots; ++s) kernels::mbarrier_init(&landed[s], 1);
  }
  __syncwarp();
  const std::size_t first = std::size_t(blockIdx.x) * kPullWarps + warp, stride = std::size_t(gridDim.x) * kPullWarps;
  const std::size_t mine = first < pieces ? (pieces - first + stride - 1) / stride : 0;
  const auto start = [&](std::size_t k) {  // lane 0: my piece k into slot k % kPullSlots
    if (lane != 0 || k >= mine) return;
    uint64_t* bar = &landed[k % kPullSlots];
    kernels::fence_async_shared();
    kernels::mbarrier_expect_bytes(bar, kPullPieceBytes);
    kernels::bulk_load(slots + (k % kPullSlots) * kPullPieceBytes, src + (first + k * stride) * kPullPieceBytes,
                       kPullPieceBytes, bar);
  };
  for (int k = 0; k < kPullSlots - 1; ++k) start(k);
  uint32_t folded = 0;
  for (std::size_t k = 0; k < mine; ++k) {
    __syncwarp();  // every lane has read piece k - 1: its slot may be reloaded
    start(k + kPullSlots - 1);
    const transport::WaitSite site{transport::WaitPhase::test_signal, -1, uint32_t(k)};
    if (!__all_sync(~0u, kernels::mbarrier_wait(team, &landed[k % kPullSlots], uint32_t(k / kPullSlots) & 1u, site)))
      return;
    const uint4* piece = reinterpret_cast<const uint4*>(slots + (k % kPullSlots) * kPullPieceBytes);
    for (int v = lane; v < kPullPieceBytes / 16; v += kernels::kWarp) folded ^= piece[v].x ^ piece[v].w;
  }
  if (folded == never) sink[threadIdx.x] = folded;
}

// Rank 0 and rank 1 bounce a counter: each waits for the other's value, then bumps the other's flag.
// Word `word` of each rank's flags is written only by the other rank. kRelease: each store a release, as
// the library's signals are; otherwise relaxed, as its stamped data and the handshake's word are.
template <bool kRelease>
__global__ void ping_pong(TeamView team, transport::SymmetricView flags, int word, int iterations,
                          uint64_t* elapsed_ns) {
  const int other = 1 - team.rank;
  uint64_t* mine = reinterpret_cast<uint64_t*>(flags.base[team.rank]) + word;
  uint64_t* theirs = reinterpret_cast<uint64_t*>(flags.base[other]) + word;
  const auto bump = [&](int i) {
    if constexpr (kRelease) {
      transport::store_release_sys(theirs, i);
    } else {
      transport::store_relaxed_sys(theirs, i);
    }
  };
  const transport::WaitSite site{transport::WaitPhase::test_signal, other, uint32_t(word)};
  const uint64_t start = transport::global_timer_ns();
  for (int i = 1; i <= iterations; ++i) {
    if (team.rank == 0) {
      bump(i);
      if (!transport::wait_at_least(team, mine, i, site)) return;
    } else {
      if (!transport::wait_at_least(team, mine, i, site)) return;
      bump(i);
    }
  }
  *elapsed_ns = transport::global_timer_ns() - start;
}

// The handshake (limits.hpp's Handshake), in a grid shaped as the LL kernels': thread 0 of CTA 0 stores its
// clock into `to_next` (the next rank's word; only this rank writes it) before anything else, then waits
// until the previous rank's store into `from_previous` passes the value it saw in its last call
// (state->seen: each rank's clock only grows), and records how long it waited from its start. The other
// threads return at once, as an empty kernel's do. No barrier orders a call's store after the peer's read
// of the last one: the next call starts after the bench's team barrier, which waits for this rank.
struct HandshakeState {
  uint64_t seen;   // the previous rank's word as this rank last saw it
  uint32_t calls;  // calls so far; call i's wait goes to waited_ns[i]
};
constexpr uint32_t kHandshakeMaxCalls = 128;
constexpr int kHandshakeWarmup = 5, kHandshakeReplays = 100;

__global__ void __launch_bounds__(512) handshake(TeamView team, uint64_t* to_next, const uint64_t* from_previous,
                                                 int previous, HandshakeState* state, uint64_t* waited_ns) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const uint64_t start = transport::global_timer_ns();
  transport::store_relaxed_sys(to_next, start);
  const transport::WaitSite site{transport::WaitPhase::test_signal, previous, 1};
  if (!transport::wait_at_least(team, from_previous, state->seen + 1, site)) return;
  const uint64_t waited = transport::global_timer_ns() - start;
  state->seen = transport::load_relaxed_sys(from_previous);
  if (state->calls < kHandshakeMaxCalls) waited_ns[state->calls] = waited;
  ++state->calls;
}

// One thread times a chain of kLoadChain dependent loads of one 8-byte word (zero: each load's address adds
// the previous value) for each memory in `where` and both kinds of load the LL kernels poll with: out[2 m]
// a flag's (transport::load_relaxed_sys), out[2 m + 1] a stamped word's (kernels::ll::load_word, volatile),
// in ns per load. The first load of each chain pays for whatever the word's line and page cost cold; the
// chain is long enough that this hardly shows.
constexpr int kLoadChain = 64;
constexpr int kLoadMemories = 3;  // private device memory, this rank's symmetric memory, the next rank's

__device__ __forceinline__ uint64_t load_as(const uint64_t* p, bool as_word) {
  return as_word ? kernels::ll::load_word(p) : transport::load_relaxed_sys(p);
}

struct LoadTargets {
  const uint64_t* where[kLoadMemories];
};

__global__ void load_round_trips(LoadTargets targets, double* out) {
  for (int m = 0; m < kLoadMemories; ++m) {
    for (int kind = 0; kind < 2; ++kind) {
      const uint64_t* p = targets.where[m];
      const uint64_t start = transport::global_timer_ns();
      for (int i = 0; i < kLoadChain; ++i) p += load_as(p, kind == 1);
      if (p == nullptr) return;  // never: it orders the clock after the last load
      out[2 * m + kind] = double(transport::global_timer_ns() - start) / kLoadChain;
    }
  }
}

struct Context {
  Team& team;
  cudaStream_t stream;
  TeamView view;
  int sms;
};

// The handshake (limits.hpp) timed as the LL calls are, each rank's waits gathered to work out the start skew.
// `words` is zero from byte 256 on, on every rank.
Handshake measure_handshake(const Context& c, const transport::SymmetricView& words, int next, int prev,
                            double hop_us) {
  constexpr int kWord = 32;  // past the ping-pong's word
  uint64_t* to_next = reinterpret_cast<uint64_t*>(words.base[next]) + kWord;
  const uint64_t* from_previous = reinterpret_cast<const uint64_t*>(words.base[c.team.rank()]) + kWord;
  HandshakeState* state = nullptr;
  uint64_t* waited = nullptr;
  check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&state), sizeof(HandshakeState), c.stream), "cudaMallocAsync");
  check_cuda(cudaMemsetAsync(state, 0, sizeof(HandshakeState), c.stream), "cudaMemsetAsync");
  check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&waited), sizeof(uint64_t) * kHandshakeMaxCalls, c.stream),
             "cudaMallocAsync");
  Handshake h;
  const auto call = [&](cudaStream_t s) {
    handshake<<<c.sms, 512, 0, s>>>(c.view, to_next, from_previous, prev, state, waited);
    detail::check_launch("handshake");
  };
  const auto barrier = [&](cudaStream_t s) { enqueue_team_barrier(c.team, s); };
  const Timing t = time_graph(c.stream, kHandshakeWarmup, kHandshakeReplays, call, barrier);
  static_assert(kHandshakeWarmup + kHandshakeReplays <= int(kHandshakeMaxCalls));
  std::vector<uint64_t> ns(kHandshakeReplays);
  check_cuda(cudaMemcpyAsync(ns.data(), waited + kHandshakeWarmup, sizeof(uint64_t) * ns.size(), cudaMemcpyDeviceToHost,
                             c.stream),
             "cudaMemcpyAsync");
  check_cuda(cudaFreeAsync(state, c.stream), "cudaFreeAsync");
  check_cuda(cudaFreeAsync(waited, c.stream), "cudaFreeAsync");
  check_cuda(cudaStreamSynchronize(c.stream), "cudaStreamSynchronize");
  c.team.check_device_errors();

  std::vector<double> mine{t.median_us};
  for (uint64_t v : ns) mine.push_back(double(v) / 1e3);
  const std::vector<double> all = all_gather(c.team, c.stream, mine);  // [R][1 + replays]
  const int R = c.team.size(), n = int(mine.size());
  std::vector<double> skew(kHandshakeReplays, 0.0);
  for (int r = 0; r < R; ++r) {
    const double* row = all.data() + std::size_t(r) * n;
    h.us = std::max(h.us, row[0]);
    std::vector<double> waits(row + 1, row + n);
    for (int i = 0; i < kHandshakeReplays; ++i) skew[i] = std::max(skew[i], waits[i] - hop_us);
    if (r < 2) h.wait_us[r] = summarize(waits).median_us;
  }
  h.start_skew_us = summarize(skew).median_us;
  return h;
}

double per_direction_gbps(double us) { return double(kBytes) / (us * 1e-6) / 1e9; }

}  // namespace

Limits measure_limits(Team& team, KernelClock* kernel_clock) {
  Limits limits;
  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  cudaDeviceProp prop;
  check_cuda(cudaGetDeviceProperties(&prop, team.device()), "cudaGetDeviceProperties");
  const Context c{team, stream, team.impl().view(), prop.multiProcessorCount};
  const int next = (team.rank() + 1) % team.size();
  const int prev = (team.rank() + team.size() - 1) % team.size();
  const auto barrier = [&](cudaStream_t s) { enqueue_team_barrier(team, s); };
  const auto nothing = [](cudaStream_t) {};

  SymmetricMemory inbox = team.allocate_symmetric(kBytes);
  void* source = nullptr;
  check_cuda(cudaMalloc(&source, kBytes), "cudaMalloc");
  const std::size_t words = kBytes / 4;
  fill_pattern<<<c.sms * 4, 512, 0, stream>>>(static_cast<uint32_t*>(source), words, uint32_t(team.rank()));
  detail::check_launch("fill_pattern");

  // HBM: a local device-to-device copy (read + write counted).
  const Timing hbm = time_on_stream(stream, 3, 20, nothing, [&](cudaStream_t s) {
    check_cuda(cudaMemcpyAsync(inbox.local(), source, kBytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
  });
  limits.hbm_copy_gbps = 2.0 * kBytes / (hbm.median_us * 1e-6) / 1e9;

  // An empty kernel of the LL grid.
  const auto empty = [&](cudaStream_t s) { empty_kernel<<<c.sms, 512, 0, s>>>(); };
  // A launch's kernel time where it is timed as the LL calls are (time_graph, 5 + 100 launches).
  const auto kernel_us = [&](const std::function<void(cudaStream_t)>& launch) {
    return graph_kernel_time(kernel_clock, stream, 5, 100, [&] { time_graph(stream, 5, 100, launch, barrier); })
        .median_us;
  };
  // One kernel per graph, after a team barrier, events around the launch: how ll_bench.cu times each LL
  // call, so the floor under each of them.
  limits.one_kernel_graph_us = time_graph(stream, 5, 100, empty, barrier).median_us;
  limits.one_kernel_graph_kernel_us = kernel_us(empty);
  // The same graph launched back to back, events around each round of launches: how ll_bench.cu times the
  // LL calls in a row by default (kLlInARowRounds rounds of LlBenchOptions::replays), so the floor under
  // that column.
  const GraphExec one_kernel = capture_graph(stream, empty);
  launch_graph(one_kernel, stream);  // its first launch uploads it
  limits.one_kernel_graph_in_a_row_us =
      time_in_a_row(stream, kLlInARowRounds, LlBenchOptions{}.replays, barrier, [&](cudaStream_t s, int) {
        launch_graph(one_kernel, s);
      }).median_us;
  // kLlCallsPerGraph empty kernels in one graph, each replay after a team barrier: how ll_bench.cu times the
  // LL calls in one graph (each launch overlaps the kernel before it), so the floor under that column.
  limits.one_kernel_in_one_graph_us = time_graph_per_call(stream, 5, 100, kLlCallsPerGraph, empty, barrier).median_us;

  if (team.size() >= 2 && !team.is_single_gpu()) {
    limits.measured_nvlink = true;
    const std::size_t vectors = kBytes / sizeof(int4);
    auto* src4 = static_cast<const int4*>(source);
    auto* dst4 = static_cast<int4*>(inbox.peer(next));
    auto sm_store = [&](int blocks) {
      const Timing t = time_on_stream(stream, 3, 20, barrier, [&](cudaStream_t s) {
        store_copy<<<blocks, 512, 0, s>>>(src4, dst4, vectors);
        detail::check_launch("store_copy");
      });
      return per_direction_gbps(t.median_us);
    };
    limits.nvlink_sm_store_blocks = c.sms;
    limits.nvlink_sm_store_gbps = sm_store(c.sms);
    limits.nvlink_sm_store_16_blocks_gbps = sm_store(16);
    const Timing ce = time_on_stream(stream, 3, 20, barrier, [&](cudaStream_t s) {
      check_cuda(cudaMemcpyAsync(inbox.peer(next), source, kBytes, cudaMemcpyDeviceToDevice, s),
                 "cudaMemcpyAsync(peer)");
    });
    limits.nvlink_copy_engine_gbps = per_direction_gbps(ce.median_us);

    // Everything that arrived came from the previous rank: check every word.
    enqueue_team_barrier(team, stream);
    unsigned long long* bad = nullptr;
    check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&bad), sizeof(*bad), stream), "cudaMallocAsync");
    check_cuda(cudaMemsetAsync(bad, 0, sizeof(*bad), stream), "cudaMemsetAsync");
    count_mismatches<<<c.sms * 4, 512, 0, stream>>>(static_cast<const uint32_t*>(inbox.local()), words, uint32_t(prev),
                                                    bad);
    detail::check_launch("count_mismatches");
    unsigned long long bad_host = 1;
    check_cuda(cudaMemcpyAsync(&bad_host, bad, sizeof(bad_host), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
    check_cuda(cudaFreeAsync(bad, stream), "cudaFreeAsync");
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    limits.data_checked = bad_host == 0;
    if (bad_host != 0)
      detail::fail(ErrorKind::internal, "NVLink limit test: " + std::to_string(bad_host) + " words arrived wrong");

    // After the check above: these overwrite the inbox.
    // Pulled by bulk loads (bulk_pull) into 16 CTAs and into one per SM, every rank from the next at once;
    // then 16 CTAs pulling half the bytes while the copy engine stores the other half into the next rank
    // (a side stream forked and joined by events), the two sharing each direction of the link.
    detail::allow_dynamic_shared_memory(reinterpret_cast<const void*>(bulk_pull), kPullStageBytes,
                                        "cudaFuncSetAttribute(bulk_pull)");
    auto* pulled = static_cast<const uint8_t*>(inbox.peer(next));
    auto* sink = static_cast<uint32_t*>(inbox.local());  // written only if a fold matches `never`
    const auto pull = [&](cudaStream_t s, int blocks, std::size_t bytes) {
      bulk_pull<<<blocks, kPullWarps * kernels::kWarp, kPullStageBytes, s>>>(c.view, pulled, bytes / kPullPieceBytes,
                                                                             0x9e3779b9u, sink);
      detail::check_launch("bulk_pull");
    };
    const auto pull_gbps = [&](int blocks) {
      return per_direction_gbps(
          time_on_stream(stream, 3, 20, barrier, [&](cudaStream_t s) { pull(s, blocks, kBytes); }).median_us);
    };
    limits.nvlink_pull_gbps = pull_gbps(c.sms);
    limits.nvlink_pull_16_blocks_gbps = pull_gbps(16);
    const Stream side_stream = new_stream();
    cudaStream_t side = side_stream.get();
    cudaEvent_t forked, joined;
    check_cuda(cudaEventCreateWithFlags(&forked, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventCreateWithFlags(&joined, cudaEventDisableTiming), "cudaEventCreate");
    const Timing shared = time_on_stream(stream, 3, 20, barrier, [&](cudaStream_t s) {
      check_cuda(cudaEventRecord(forked, s), "cudaEventRecord");
      check_cuda(cudaStreamWaitEvent(side, forked, 0), "cudaStreamWaitEvent");
      // The upper half of the inbox: the pull reads the lower half of the next rank's.
      check_cuda(
          cudaMemcpyAsync(static_cast<uint8_t*>(inbox.peer(next)) + kBytes / 2,
                          static_cast<const uint8_t*>(source) + kBytes / 2, kBytes / 2, cudaMemcpyDeviceToDevice, side),
          "cudaMemcpyAsync(peer)");
      check_cuda(cudaEventRecord(joined, side), "cudaEventRecord");
      pull(s, 16, kBytes / 2);
      check_cuda(cudaStreamWaitEvent(s, joined, 0), "cudaStreamWaitEvent");
    });
    limits.nvlink_pull_16_blocks_beside_copy_engine_gbps = per_direction_gbps(shared.median_us);
    cudaEventDestroy(forked);  // time_on_stream synchronised the stream, which waited for the side's work
    cudaEventDestroy(joined);

    limits.stamps = probe_stamped_stores(team, StampPath::nvlink);
    limits.stamps_pulled = probe_stamped_stores(team, StampPath::pulled);

    // Bursts of lines (line_burst) from the LL grid to the next rank, every rank at once, each kernel
    // captured alone in a graph and timed as the LL calls are (its stores are complete when it is): the
    // floor under an LL call that stores that much. After the check above: they overwrite the inbox.
    for (LineBurst& burst : limits.line_bursts) {
      const int items = int(burst.bytes / kBurstItemBytes);
      const auto store = [&](cudaStream_t s) {
        line_burst<<<c.sms, 512, 0, s>>>(static_cast<uint4*>(inbox.peer(next)), items);
        detail::check_launch("line_burst");
      };
      burst.us = time_graph(stream, 5, 100, store, barrier).median_us;
      burst.kernel_us = kernel_us(store);
      const auto pull = [&](cudaStream_t s) {
        line_pull<<<c.sms, 512, 0, s>>>(static_cast<const uint4*>(inbox.peer(next)), items, 0x9e3779b9u,
                                        static_cast<uint32_t*>(inbox.local()));
        detail::check_launch("line_pull");
      };
      burst.pull_us = time_graph(stream, 5, 100, pull, barrier).median_us;
    }

    // One-way latencies between ranks 0 and 1 (the others only join the barrier and keep 0): a release
    // store's (word 0), then a relaxed one's (word 8).
    SymmetricMemory flags = team.allocate_symmetric(4096);
    const transport::SymmetricView flags_view = team.impl().symmetric_view(flags);
    const auto one_way_us = [&](auto kernel, int word) {
      enqueue_team_barrier(team, stream);
      if (team.rank() >= 2) return 0.0;
      uint64_t* elapsed = nullptr;
      check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&elapsed), sizeof(*elapsed), stream), "cudaMallocAsync");
      kernel<<<1, 1, 0, stream>>>(c.view, flags_view, word, kPingPongs, elapsed);
      detail::check_launch("ping_pong");
      uint64_t ns = 0;
      check_cuda(cudaMemcpyAsync(&ns, elapsed, sizeof(ns), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
      check_cuda(cudaFreeAsync(elapsed, stream), "cudaFreeAsync");
      check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      return double(ns) / 1e3 / (2.0 * kPingPongs);
    };
    limits.flag_latency_us = one_way_us(ping_pong<true>, 0);
    limits.relaxed_word_latency_us = one_way_us(ping_pong<false>, 8);

    // Load round trips: the words past the ping-pong's are zero on every rank.
    uint64_t* private_word = nullptr;
    double* round_trips = nullptr;
    check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&private_word), sizeof(uint64_t), stream), "cudaMallocAsync");
    check_cuda(cudaMemsetAsync(private_word, 0, sizeof(uint64_t), stream), "cudaMemsetAsync");
    check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&round_trips), sizeof(double) * 2 * kLoadMemories, stream),
               "cudaMallocAsync");
    const LoadTargets targets{{private_word, reinterpret_cast<const uint64_t*>(flags_view.base[team.rank()]) + 64,
                               reinterpret_cast<const uint64_t*>(flags_view.base[next]) + 64}};
    load_round_trips<<<1, 1, 0, stream>>>(targets, round_trips);
    detail::check_launch("load_round_trips");
    double ns[2 * kLoadMemories] = {};
    check_cuda(cudaMemcpyAsync(ns, round_trips, sizeof(ns), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
    check_cuda(cudaFreeAsync(private_word, stream), "cudaFreeAsync");
    check_cuda(cudaFreeAsync(round_trips, stream), "cudaFreeAsync");
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    limits.load_private_ns = {ns[0], ns[1]};
    limits.load_own_symmetric_ns = {ns[2], ns[3]};
    limits.load_peer_symmetric_ns = {ns[4], ns[5]};
    enqueue_team_barrier(team, stream);  // the peers' chains read this rank's words: done before `flags` goes
    limits.handshake = measure_handshake(c, flags_view, next, prev, limits.relaxed_word_latency_us);
  }
  // A rank's stamped stores to its own memory: measured in a run of one process on one GPU too (not in a
  // single-GPU multi-rank team).
  if (!team.is_single_gpu()) limits.stamps_same_gpu = probe_stamped_stores(team, StampPath::same_gpu);
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  team.check_device_errors();
  cudaFree(source);
  cudaStreamDestroy(stream);
  return limits;
}

}  // namespace epx::bench
