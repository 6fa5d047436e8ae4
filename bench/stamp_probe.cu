// Do stamped stores arrive whole (over NVLink, and from a rank to its own memory)? The LL protocol
// (src/kernels/ll/protocol.cuh) lets a receiver take data as soon as its stamp shows, with no fence or
// flag: that needs a store and the load that sees it to move the stamp and its payload together. This
// probe counts how often a receiver sees a current stamp next to stale payload, for three kinds of store:
//   * 16 bytes: one st.v4 per thread, stamp in its first word, three words of payload;
//   * 128 bytes: one warp store instruction, 8 lanes per line, stamp in the first word of the line's
//     last 16 bytes; the receiver loads the whole line in one warp load instruction too;
//   * 128 bytes by bulk copy: the same lines, staged by a warp in shared memory 8 at a time (1 KiB, an
//     LL work item) and stored by two cp.async.bulk (kernels/common/bulk_copy.cuh) of n and 8 - n lines,
//     n = 1..7 by chunk: copies of every size below 1 KiB, starting at 128-byte boundaries, as LL rows'
//     items do (a row of ll_row_lines(2 H) lines is not a multiple of 8 lines). Read as above: whether
//     a protocol may send its lines through the copy engine instead of the SM's stores.
// Three passes. Over NVLink: every rank writes its next rank's area while reading its own (both
// directions busy). On the same GPU (run with one GPU too): every rank writes its own area while reading
// it (what a rank's rows to itself would meet: the writer's lines reach the reader through L2, not the
// link). Pulled: every rank writes its own area while the previous rank reads it over NVLink (what a
// receiver that loads its lines from the sender's memory would meet). One epoch per kernel; an epoch
// overwrites the previous one's lines, so stale payload is the previous epoch's. A team barrier separates
// epochs. Waits are bounded: a line that never shows its stamp is counted as missing, not waited for.
#include "bench/stamp_probe.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

#include "bench/team_sync.hpp"
#include "core/cuda_check.hpp"
#include "kernels/common/bulk_copy.cuh"
#include "kernels/ll/protocol.cuh"
#include "transport/device/wait.cuh"

namespace epx::bench {
namespace {

using detail::check_cuda;

constexpr int kLines = 16384;  // 128-byte lines per granularity and epoch: 2 MiB
constexpr int kVectors = 8;    // 16-byte vectors per line
constexpr int kEpochs = 64;
constexpr int kStageLines = 8;  // lines per chunk staged for bulk copies
constexpr int kWriterBlocks = 32, kReaderBlocks = 32, kThreads = 512;
constexpr uint64_t kMissingAfterNs = 100'000'000;  // 0.1 s without the stamp: missing

struct Area {
  uint4 words[kLines][kVectors];  // 16-byte granularity: every vector stamped
  uint4 lines[kLines][kVectors];  // 128-byte granularity: vector 7 stamped
  uint4 bulk[kLines][kVectors];   // the same lines, written by bulk copies
};

struct Counts {
  unsigned long long torn_16, missing_16, torn_128, missing_128, torn_bulk, missing_bulk;
};

// A writer warp's shared-memory stages for its bulk stores: two, so that it fills one while the copy
// engine reads the other.
using BulkStage = uint4[kStageLines][kVectors];

__device__ uint32_t payload(uint32_t epoch, int line, int vector, int word) {
  return (epoch * 2654435761u) ^ (uint32_t(line) << 8) ^ (uint32_t(vector) << 4) ^ uint32_t(word) ^ 0x9e3779b9u;
}

__device__ uint4 stamped_vector(uint32_t epoch, int line, int vector) {
  return uint4{epoch, payload(epoch, line, vector, 1), payload(epoch, line, vector, 2),
               payload(epoch, line, vector, 3)};
}

__device__ uint4 line_vector(uint32_t epoch, int line, int vector) {
  return vector == kVectors - 1 ? stamped_vector(epoch, line, vector)
                                : uint4{payload(epoch, line, vector, 0), payload(epoch, line, vector, 1),
                                        payload(epoch, line, vector, 2), payload(epoch, line, vector, 3)};
}

// The LL protocols' own accesses (kernels/ll/protocol.cuh): 16-byte volatile stores and loads.
using kernels::ll::load_vector;
using kernels::ll::store_vector;

__device__ bool equal(uint4 a, uint4 b) { return a.x == b.x && a.y == b.y && a.z == b.z && a.w == b.w; }

// Writer warps: lane l writes vector l % 8 of line 4 * (its warp's step) + l / 8 of the first two areas;
// then the warp's chunks of kStageLines lines of the bulk area: the lanes stage a chunk (the writes made
// visible to the copy engine by each lane's proxy fence), lane 0 stores it with two bulk copies (n and
// kStageLines - n lines), and before it reuses a stage waits until the copies that read it are done
// reading (all but the previous chunk's two).
__device__ void write_epoch(Area* area, uint32_t epoch, BulkStage (&stages)[2]) {
  const int lane = threadIdx.x % 32, warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int warps = kWriterBlocks * kThreads / 32;
  const int vector = lane % kVectors;
  for (int line = warp * 4 + lane / kVectors; line < kLines; line += warps * 4) {
    store_vector(&area->words[line][vector], stamped_vector(epoch, line, vector));
    store_vector(&area->lines[line][vector], line_vector(epoch, line, vector));
  }
  int stage = 0;
  for (int chunk = warp; chunk < kLines / kStageLines; chunk += warps, stage ^= 1) {
    if (lane == 0) kernels::bulk_wait_read<2>();
    __syncwarp();
    for (int i = lane; i < kStageLines * kVectors; i += 32) {
      stages[stage][i / kVectors][i % kVectors] = line_vector(epoch, chunk * kStageLines + i / kVectors, i % kVectors);
    }
    kernels::fence_async_shared();
    __syncwarp();
    if (lane == 0) {
      const int n = 1 + chunk % (kStageLines - 1), first = chunk * kStageLines;
      kernels::bulk_store(&area->bulk[first][0], &stages[stage][0][0], uint32_t(n * sizeof(uint4) * kVectors));
      kernels::bulk_commit();
      kernels::bulk_store(&area->bulk[first + n][0], &stages[stage][n][0],
                          uint32_t((kStageLines - n) * sizeof(uint4) * kVectors));
      kernels::bulk_commit();
    }
  }
  if (lane == 0) kernels::bulk_wait_all();
}

// Whole warp: lane l's share (vector l % 8) of the 128-byte line `line` of `lines`, polled until the line's
// stamp (lane 7 of its 8) shows this epoch or the bound passes; counts a torn vector, or the line missing
// once (on vector 0).
__device__ void read_line(const uint4 (*lines)[kVectors], int line, uint32_t epoch, unsigned long long& torn,
                          unsigned long long& missing) {
  const int vector = threadIdx.x % kVectors;
  const uint64_t start = transport::global_timer_ns();
  bool done = false;
  for (;;) {
    const uint4 got = load_vector(&lines[line][vector]);
    const uint32_t stamp = __shfl_sync(0xffffffffu, got.x, kVectors - 1, kVectors);
    if (!done && stamp == epoch) {
      torn += !equal(got, line_vector(epoch, line, vector));
      done = true;
    }
    if (!done && transport::global_timer_ns() - start > kMissingAfterNs) {
      missing += vector == 0;
      done = true;
    }
    if (__all_sync(0xffffffffu, done)) break;
  }
}

// Reader warps: the same lanes poll the area they read (their own, or the next rank's when pulled) until
// the stamps of this epoch show, then compare what the same load brought.
__device__ void read_epoch(const Area* area, uint32_t epoch, Counts* counts) {
  const int lane = threadIdx.x % 32;
  const int warp = ((blockIdx.x - kWriterBlocks) * blockDim.x + threadIdx.x) / 32;
  const int warps = kReaderBlocks * kThreads / 32;
  const int vector = lane % kVectors;
  unsigned long long torn_16 = 0, missing_16 = 0, torn_128 = 0, missing_128 = 0, torn_bulk = 0, missing_bulk = 0;
  for (int line = warp * 4 + lane / kVectors; line < kLines; line += warps * 4) {
    // 16 bytes: each lane on its own.
    const uint64_t start = transport::global_timer_ns();
    for (;;) {
      const uint4 got = load_vector(&area->words[line][vector]);
      if (got.x == epoch) {
        torn_16 += !equal(got, stamped_vector(epoch, line, vector));
        break;
      }
      if (transport::global_timer_ns() - start > kMissingAfterNs) {
        ++missing_16;
        break;
      }
    }
    // 128 bytes: the 8 lanes of a line load it together; lane 7 holds the stamp.
    read_line(area->lines, line, epoch, torn_128, missing_128);
    read_line(area->bulk, line, epoch, torn_bulk, missing_bulk);
  }
  if (torn_16 | missing_16 | torn_128 | missing_128 | torn_bulk | missing_bulk) {
    atomicAdd(&counts->torn_16, torn_16);
    atomicAdd(&counts->missing_16, missing_16);
    atomicAdd(&counts->torn_128, torn_128);
    atomicAdd(&counts->missing_128, missing_128);
    atomicAdd(&counts->torn_bulk, torn_bulk);
    atomicAdd(&counts->missing_bulk, missing_bulk);
  }
}

__global__ void __launch_bounds__(kThreads)
    stamp_epoch(Area* written, const Area* read, uint32_t epoch, Counts* counts) {
  __shared__ BulkStage stages[kThreads / 32][2];
  if (blockIdx.x < kWriterBlocks) {
    write_epoch(written, epoch, stages[threadIdx.x / 32]);
  } else {
    read_epoch(read, epoch, counts);
  }
}

}  // namespace

StampProbe probe_stamped_stores(Team& team, StampPath path) {
  StampProbe probe;
  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  SymmetricMemory area = team.allocate_symmetric(sizeof(Area));
  check_cuda(cudaMemsetAsync(area.local(), 0, sizeof(Area), stream), "cudaMemsetAsync");
  Counts* counts = nullptr;
  check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&counts), sizeof(Counts), stream), "cudaMallocAsync");
  check_cuda(cudaMemsetAsync(counts, 0, sizeof(Counts), stream), "cudaMemsetAsync");
  const int next = (team.rank() + 1) % team.size();
  Area* written = static_cast<Area*>(path == StampPath::nvlink ? area.peer(next) : area.local());
  const Area* read = static_cast<const Area*>(path == StampPath::pulled ? area.peer(next) : area.local());
  for (uint32_t epoch = 1; epoch <= kEpochs; ++epoch) {
    enqueue_team_barrier(team, stream);  // every reader is done with the previous epoch
    stamp_epoch<<<kWriterBlocks + kReaderBlocks, kThreads, 0, stream>>>(written, read, epoch, counts);
    detail::check_launch("stamp_epoch");
  }
  Counts mine{};
  check_cuda(cudaMemcpyAsync(&mine, counts, sizeof(mine), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  check_cuda(cudaFreeAsync(counts, stream), "cudaFreeAsync");
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  const std::vector<double> all =
      all_gather(team, stream,
                 {double(mine.torn_16), double(mine.missing_16), double(mine.torn_128), double(mine.missing_128),
                  double(mine.torn_bulk), double(mine.missing_bulk)});
  for (std::size_t i = 0; i < all.size(); i += 6) {
    probe.torn_16 += int64_t(all[i]);
    probe.missing_16 += int64_t(all[i + 1]);
    probe.torn_128 += int64_t(all[i + 2]);
    probe.missing_128 += int64_t(all[i + 3]);
    probe.torn_bulk += int64_t(all[i + 4]);
    probe.missing_bulk += int64_t(all[i + 5]);
  }
  probe.lines = int64_t(kLines) * kEpochs * team.size();
  cudaStreamDestroy(stream);
  return probe;
}

}  // namespace epx::bench
