// epx-start-probe: what a kernel pays before it does any work, and what the operations on a warp's path
// cost, on one GPU. The LL phase traces show
// every step of a call taking about a microsecond, even steps that only compute; two suspects are
// fetching the kernel's code (the LL dispatch kernel is ~128 KB of instructions) and the first loads'
// address translations. One warp of one CTA measures, with clock64:
//   * loads: the kernel's first load (a word its earlier launches also read), a second word of the
//     same page, and a word of a page 1 GiB away that no launch read before;
//   * code: a pass over other_code_pass (other_code.cuh: ~52 KB of instructions run, between as much
//     not run), then a second pass, whose code the first has fetched (all but two stages: the second
//     pass flips bit 0 of the choice).
// Conditions, each launch timed on its own: the probe again right after itself (its code and pages
// used just before), after other_code_kernel (the whole of another ~105 KB of code), and after a
// kernel that touches one word in every 2 MiB page of 4 GiB (translations of other pages). Then the
// latency of the operations the LL kernels chain on a warp's path (op_latency_kernel); what a launch of
// the LL grid costs beyond an empty kernel's for what the LL kernels have and an empty one has not
// (launch_cost_rows): dynamic shared memory, a preferred carveout, a large parameter block read in a
// chain; every warp's first load in a grid of the LL grid's size (first_load_rows); a combine item's work
// per warp on one SM or spread over many (item_work_rows); y's rows read as the LL combine reads them by
// every warp of the grid, where y puts them and packed together (y_read_rows); and the LL combine's
// own-rows phase, a record and then 0-8 rows a warp (y_phase_rows). Not part of the library.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <vector>

#include "bench/device_data.hpp"
#include "bench/other_code.cuh"
#include "bench/timing.hpp"
#include "core/divisor.hpp"

namespace {

using namespace epx::bench;
using epx::core::Divisor;

constexpr std::size_t kPageBytes = std::size_t(2) << 20;
constexpr std::size_t kFarBytes = std::size_t(1) << 30;
constexpr std::size_t kSweepBytes = std::size_t(4) << 30;
constexpr int kPoints = 6;  // clock64 at: start, first load back, second, far, pass 1 done, pass 2 done

using epx::detail::check_cuda;

__device__ __forceinline__ uint32_t load_relaxed(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// The clock, read after every earlier memory access of this thread in program order (clock64() alone may
// be scheduled before an access it is meant to follow).
__device__ __forceinline__ long long clock_now() {
  long long t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t) : : "memory");
  return t;
}

// The clock after `v` has arrived: v goes to shared memory first, so the read waits for it.
__device__ __forceinline__ long long clock_after(uint32_t v, uint32_t* sink) {
  asm volatile("st.shared.u32 [%0], %1;" ::"r"(uint32_t(__cvta_generic_to_shared(sink))), "r"(v) : "memory");
  return clock_now();
}

// `words`: kFarBytes + a page; word 0 is the first load, word 32 the second, the page at kFarBytes the far one
// (its word `far_word`, a different one each launch). out: kPoints clocks, the globaltimer ns from the
// first to the last, and the result.
__global__ void probe_kernel(const uint32_t* words, std::size_t far_word, uint32_t pick, long long* out) {
  __shared__ uint32_t sink[32];
  if (threadIdx.x >= 32) return;
  long long t[kPoints];
  uint64_t ns_start, ns_end;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns_start));
  t[0] = clock_now();
  const uint32_t a = load_relaxed(words);
  t[1] = clock_after(a, sink + threadIdx.x);
  const uint32_t b = load_relaxed(words + 32);
  t[2] = clock_after(b, sink + threadIdx.x);
  const uint32_t c = load_relaxed(words + kFarBytes / 4 + far_word);
  t[3] = clock_after(c, sink + threadIdx.x);
  uint32_t x[kOtherCodeAccumulators];
#pragma unroll
  for (int i = 0; i < kOtherCodeAccumulators; ++i) x[i] = a + b + c + threadIdx.x * 17u + i;
#pragma unroll 1
  for (int pass = 0; pass < 2; ++pass) {
    other_code_pass<0>(x, pick ^ uint32_t(pass));
    uint32_t sum = 0;
#pragma unroll
    for (int i = 0; i < kOtherCodeAccumulators; ++i) sum ^= x[i];
    t[4 + pass] = clock_after(sum, sink + threadIdx.x);
  }
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns_end));
  if (threadIdx.x == 0) {
    for (int i = 0; i < kPoints; ++i) out[i] = t[i];
    out[kPoints] = (long long)(ns_end - ns_start);  // for the clock rate while it ran
    out[kPoints + 1] = sink[0];
  }
}

// One word in every page of `bytes`: other translations.
__global__ void sweep_kernel(uint32_t* words, std::size_t bytes) {
  const std::size_t pages = bytes / kPageBytes;
  for (std::size_t p = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; p < pages;
       p += std::size_t(gridDim.x) * blockDim.x) {
    words[p * (kPageBytes / 4)] += 1u;
  }
}

struct Row {
  const char* name;
  std::vector<std::vector<double>> us;  // per point interval, per launch
};

// Operations the LL kernels chain on a warp's path, each timed as a chain of kChainOps that depend on
// each other (one warp, clock64): cycles per step. Each step adds what the operation returns to the
// running value, so none can be folded or overlapped; ChainOp::alu is that addition alone (with an XOR),
// the baseline of the others. The division's divisor depends on the running value, as a division by a
// run-time value on a kernel's path is not hoisted out of any loop.
enum class ChainOp : int { alu, shfl, ballot, match_any, reduce_add, lds, atoms_max, div, divisor, count };
constexpr const char* kChainOpNames[] = {"add+xor (baseline)", "__shfl_sync",       "__ballot_sync",
                                         "__match_any_sync",   "__reduce_add_sync", "shared load",
                                         "shared atomicMax",   "int division",      "core::Divisor"};
constexpr int kChainOps = 256;

template <ChainOp kOp>
__device__ __forceinline__ uint32_t chain_step(uint32_t x, uint32_t salt, uint32_t* smem, uint32_t d,
                                               const Divisor& by_d) {
  const uint32_t lane = threadIdx.x % 32;
  uint32_t r = 0;
  if constexpr (kOp == ChainOp::shfl) r = __shfl_sync(~0u, x, (x + lane) & 31);
  if constexpr (kOp == ChainOp::ballot) r = __ballot_sync(~0u, (x >> lane) & 1);
  if constexpr (kOp == ChainOp::match_any) r = __match_any_sync(~0u, x & 7);
  if constexpr (kOp == ChainOp::reduce_add) r = __reduce_add_sync(~0u, x & 255);
  if constexpr (kOp == ChainOp::lds) r = smem[x & 255];
  if constexpr (kOp == ChainOp::atoms_max) r = atomicMax(&smem[x & 255], x);
  if constexpr (kOp == ChainOp::div) r = x / (d | (x >> 31));  // the divisor depends on x: not hoisted
  if constexpr (kOp == ChainOp::divisor) r = by_d.quotient(x & 0x7fffffffu);
  return (x ^ salt) + r;
}

// out[op]: cycles per step of op's chain.
template <ChainOp kOp>
__device__ double chain_cycles(uint32_t seed, uint32_t* smem, uint32_t d, const Divisor& by_d) {
  uint32_t x = seed + threadIdx.x;
  const long long start = clock64();
#pragma unroll 1
  for (int i = 0; i < kChainOps; ++i) x = chain_step<kOp>(x, seed, smem, d, by_d);
  const long long end = clock_after(x, smem + 256 + threadIdx.x % 32);
  return double(end - start) / kChainOps;
}

__global__ void op_latency_kernel(uint32_t seed, uint32_t d, Divisor by_d, double* out) {
  __shared__ uint32_t smem[256 + 32];
  if (threadIdx.x >= 32) return;
  for (int i = threadIdx.x; i < 256; i += 32) smem[i] = i * 2654435761u;
  __syncwarp();
  double cycles[int(ChainOp::count)];
  cycles[0] = chain_cycles<ChainOp::alu>(seed, smem, d, by_d);
  cycles[1] = chain_cycles<ChainOp::shfl>(seed, smem, d, by_d);
  cycles[2] = chain_cycles<ChainOp::ballot>(seed, smem, d, by_d);
  cycles[3] = chain_cycles<ChainOp::match_any>(seed, smem, d, by_d);
  cycles[4] = chain_cycles<ChainOp::reduce_add>(seed, smem, d, by_d);
  cycles[5] = chain_cycles<ChainOp::lds>(seed, smem, d, by_d);
  cycles[6] = chain_cycles<ChainOp::atoms_max>(seed, smem, d, by_d);
  cycles[7] = chain_cycles<ChainOp::div>(seed, smem, d, by_d);
  cycles[8] = chain_cycles<ChainOp::divisor>(seed, smem, d, by_d);
  if (threadIdx.x == 0) {
    for (int i = 0; i < int(ChainOp::count); ++i) out[i] = cycles[i];
  }
}

// The median over kSpreadLaunches launches of the warps' median and of their maximum, in us: launch()
// runs one launch, which leaves each of `warps` warps' cycles in `cycles`; one launch more goes first, as
// a warm-up.
constexpr int kSpreadLaunches = 11;
struct WarpSpread {
  double median_us, max_us;
};
WarpSpread warp_spread(const std::function<void()>& launch, const long long* cycles, int warps, int clock_khz) {
  std::vector<double> medians, maxima;
  for (int rep = 0; rep < kSpreadLaunches + 1; ++rep) {
    launch();
    check_cuda(cudaDeviceSynchronize(), "warp_spread");
    if (rep == 0) continue;
    std::vector<double> us(cycles, cycles + warps);
    for (double& u : us) u /= clock_khz / 1e3;
    const Timing t = summarize(std::move(us));
    medians.push_back(t.median_us);
    maxima.push_back(t.max_us);
  }
  return WarpSpread{summarize(std::move(medians)).median_us, summarize(std::move(maxima)).median_us};
}

// ---- First loads of a grid: every warp's first load, the LL grid's size ----
// Lane 0 of every warp loads one word, from page (warp % pages) of `words` (a line of its own in it), and
// records the cycles until it has the value: whether the first loads of many SMs at once, over several
// pages, wait for each other (address translation) where one warp's does not.
// `hot`: 0, or first every warp loads one word all warps load (1: through L1, ld.ca; 2: ld.relaxed.sys)
// and the timed load starts right after it is issued (as a kernel's first loads follow its flag loads).
__global__ void __launch_bounds__(512)
    first_loads_kernel(const uint32_t* words, int pages, int hot, long long* cycles) {
  __shared__ uint32_t sink[32];
  const int warp = int(blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32);
  if (threadIdx.x % 32 != 0) return;
  const uint32_t* p = words + std::size_t(warp % pages) * (kPageBytes / 4) + std::size_t(warp / pages % 1024) * 32 + 8;
  asm volatile("" ::"l"(p));  // the address (from the parameters) is worked out before the clock starts
  if (hot == 1) asm volatile("{\n .reg .u32 h;\n ld.global.ca.u32 h, [%0];\n}" ::"l"(words) : "memory");
  if (hot == 2) load_relaxed(words);
  const long long start = clock_now();
  const uint32_t v = load_relaxed(p);
  cycles[warp] = clock_after(v, sink + threadIdx.x / 32) - start;
}

void first_load_rows(int sms, uint32_t* words, uint32_t* sweep, int clock_khz) {
  struct Shape {
    int ctas, pages, hot;
  };
  const Shape shapes[] = {{1, 1, 0}, {sms, 1, 0}, {sms, 8, 0}, {sms, 32, 0}, {sms, 128, 0}, {sms, 8, 1}, {sms, 8, 2}};
  long long* cycles = nullptr;
  check_cuda(cudaMallocHost(&cycles, sizeof(long long) * sms * 16), "cudaMallocHost");
  std::printf(
      "\nepx-start-probe: every warp's first load (lane 0, one word of page warp %% pages); median over %d "
      "launches of the warps' median and maximum, us\n%-34s | %-22s | %-22s\n",
      kSpreadLaunches, "CTAs x 512 threads, pages", "after itself", "after a page sweep");
  for (const Shape& shape : shapes) {
    char name[48];
    std::snprintf(name, sizeof name, "%d x 512, %d%s", shape.ctas, shape.pages,
                  shape.hot == 1   ? ", hot ld.ca"
                  : shape.hot == 2 ? ", hot relaxed.sys"
                                   : "");
    std::printf("%-34s", name);
    for (const bool swept : {false, true}) {
      const WarpSpread w = warp_spread(
          [&] {
            if (swept) sweep_kernel<<<sms, 256>>>(sweep, kSweepBytes);
            first_loads_kernel<<<shape.ctas, 512>>>(words, shape.pages, shape.hot, cycles);
          },
          cycles, shape.ctas * 16, clock_khz);
      std::printf(" | med %6.3f max %6.3f", w.median_us, w.max_us);
    }
    std::printf("\n");
  }
  cudaFreeHost(cycles);
}

// ---- Warps per SM: the LL kernels' per-item work, on one SM or spread ----
// Each active warp does what a combine item does with its rows: loads 4 KB (4 rows x 2 vectors per lane,
// 16 bytes each, its own part of `data`, which the launch before it read too), adds them up with FMAs
// into 16 floats a lane, and records the cycles from its start until the sums are done. The same work per
// warp on 16 warps of one CTA (one SM), on one warp of each of 16 CTAs, and on every warp of the LL grid.
__global__ void __launch_bounds__(512)
    item_work_kernel(const uint4* data, int warps_per_cta, long long* cycles, uint4* out) {
  __shared__ uint32_t sink[16];
  const int w = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  if (w >= warps_per_cta) return;
  const int item = int(blockIdx.x) * warps_per_cta + w;
  const uint4* part = data + std::size_t(item) * 256;
  const long long start = clock_now();
  uint4 in[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) in[k] = part[k * 32 + lane];
  float acc[16] = {};
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const uint32_t words[4] = {in[k].x, in[k].y, in[k].z, in[k].w};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t w16 = words[i / 2];
      const float f = __uint_as_float(i % 2 == 0 ? w16 << 16 : w16 & 0xFFFF0000u);
      acc[(k % 2) * 8 + i] = __fmaf_rn(0.5f, f, acc[(k % 2) * 8 + i]);
    }
  }
  uint32_t x = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) x ^= __float_as_uint(acc[i]);
  cycles[item] = clock_after(x, sink + w) - start;
  out[std::size_t(item) * 32 + lane] = make_uint4(x, 0u, 0u, 0u);
}

void item_work_rows(int sms, uint32_t* words, int clock_khz) {
  struct Shape {
    const char* name;
    int ctas, warps_per_cta;
  };
  const Shape shapes[] = {
      {"16 warps of one CTA", 1, 16}, {"one warp of each of 16 CTAs", 16, 1}, {"16 warps of every CTA", sms, 16}};
  const int most = sms * 16;
  long long* cycles = nullptr;
  uint4* out = nullptr;
  check_cuda(cudaMallocHost(&cycles, sizeof(long long) * most), "cudaMallocHost");
  check_cuda(cudaMalloc(&out, sizeof(uint4) * 32 * most), "cudaMalloc");
  std::printf(
      "\nepx-start-probe: a combine item's work per warp (4 KB of loads, 128 FMAs a lane); median over %d "
      "launches of the warps' median and maximum, us\n",
      kSpreadLaunches);
  for (const Shape& shape : shapes) {
    const WarpSpread w = warp_spread(  // from the warm-up on, the data is in L2
        [&] {
          item_work_kernel<<<shape.ctas, 512>>>(reinterpret_cast<const uint4*>(words), shape.warps_per_cta, cycles,
                                                out);
        },
        cycles, shape.ctas * shape.warps_per_cta, clock_khz);
    std::printf("%-30s med %6.3f max %6.3f\n", shape.name, w.median_us, w.max_us);
  }
  cudaFree(out);
  cudaFreeHost(cycles);
}

// ---- Reading y's rows as the LL combine does, on every warp of the LL grid ----
// Each warp reduces 8 rows of a 7168-column BF16 y (two batches of 4 rows' loads in flight, FMAs into 16
// floats a lane), item g = warp % 14 of each row, laid out as the combine's lines: lane i takes vector
// i % 8 of line 8 g + 4 j + i / 8 (j = 0, 1); a data vector is 16 bytes of the row's head (112 a line); the
// stamp lane (vector 7) takes the line's 12 bytes of the row's rest, as three 4-byte loads (`kWordTail`), or
// 16 bytes of the head instead (a pattern with one vector load a lane). The rows: 1024 of y, `spread` as
// the combine's packed rows (expert e's rows at e * 256, 8 of each of 128 experts: 470 MB of y) or packed
// together (rows 0-1023); warp w takes rows[8 w .. 8 w + 7]. Records the warp's cycles.
constexpr int kYHidden = 7168, kYRows = 1024, kYRowStride = kYHidden * 2;  // bytes
constexpr int kYHeadBytes = 112 * 116;                                     // 116 lines a row

// The lanes' sums (acc) of item g of rows row_of(0 .. count - 1), kInFlight rows' loads at a time.
template <int kInFlight, bool kWordTail, typename RowOf>
__device__ void add_rows(const uint8_t* y, int g, int count, RowOf row_of, float (&acc)[16]) {
  const int lane = int(threadIdx.x % 32), vec = lane % 8;
  for (int first = 0; first < count; first += kInFlight) {
    uint4 in[kInFlight][2];
#pragma unroll
    for (int b = 0; b < kInFlight; ++b) {
      const uint8_t* row = y + std::size_t(row_of(min(first + b, count - 1))) * kYRowStride;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int line = 8 * g + 4 * j + lane / 8;
        if (first + b >= count) {
          in[b][j] = make_uint4(0u, 0u, 0u, 0u);
        } else if (kWordTail && vec == 7) {
          const uint32_t* words = reinterpret_cast<const uint32_t*>(row + kYHeadBytes + 12 * line);
          in[b][j] = make_uint4(words[0], words[1], words[2], 0u);
        } else {
          in[b][j] = *reinterpret_cast<const uint4*>(row + 112 * line + 16 * vec);
        }
      }
    }
#pragma unroll
    for (int b = 0; b < kInFlight; ++b) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const uint32_t words[4] = {in[b][j].x, in[b][j].y, in[b][j].z, in[b][j].w};
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const uint32_t w16 = words[i / 2];
          const float f = __uint_as_float(i % 2 == 0 ? w16 << 16 : w16 & 0xFFFF0000u);
          acc[j * 8 + i] = __fmaf_rn(0.5f, f, acc[j * 8 + i]);
        }
      }
    }
  }
}

// The warp's cycles since `start`, once its sums are done, into cycles[w]; the sums into `out`.
__device__ void record_sums(const float (&acc)[16], long long start, int w, uint32_t* sink, long long* cycles,
                            uint4* out) {
  uint32_t x = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) x ^= __float_as_uint(acc[i]);
  cycles[w] = clock_after(x, sink + threadIdx.x / 32) - start;
  out[std::size_t(w) * 32 + threadIdx.x % 32] = make_uint4(x, 0u, 0u, 0u);
}

template <bool kWordTail>
__global__ void __launch_bounds__(512) y_read_kernel(const uint8_t* y, const int* rows, long long* cycles, uint4* out) {
  __shared__ uint32_t sink[16];
  const int w = int(blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32);
  const long long start = clock_now();
  float acc[16] = {};
  add_rows<4, kWordTail>(
      y, w % 14, 8, [&](int i) { return rows[8 * w + i]; }, acc);
  record_sums(acc, start, w, sink, cycles, out);
}

// `y`: at least 128 * 256 rows of kYRowStride bytes.
void y_read_rows(int sms, const uint8_t* y, int clock_khz) {
  const int warps = sms * 16;
  std::vector<int> spread(std::size_t(warps) * 8), packed(spread.size());
  uint32_t state = 12345u;
  for (std::size_t i = 0; i < spread.size(); ++i) {
    state = state * 1664525u + 1013904223u;
    const int r = int((state >> 8) % kYRows);
    spread[i] = (r / 8) * 256 + r % 8;
    packed[i] = r;
  }
  int* rows = nullptr;
  long long* cycles = nullptr;
  uint4* out = nullptr;
  check_cuda(cudaMalloc(&rows, sizeof(int) * spread.size()), "cudaMalloc");
  check_cuda(cudaMallocHost(&cycles, sizeof(long long) * warps), "cudaMallocHost");
  check_cuda(cudaMalloc(&out, sizeof(uint4) * 32 * warps), "cudaMalloc");
  std::printf(
      "\nepx-start-probe: y's rows read as the LL combine reads them, every warp of the grid (%d warps, 8 rows' "
      "items, 8 KB a warp, %.1f MB in all from L2); median over %d launches of the warps' median and maximum, us\n",
      warps, warps * 8.0 * 1024 / 1e6, kSpreadLaunches);
  struct Pattern {
    const char* name;
    const std::vector<int>* rows;
    void (*kernel)(const uint8_t*, const int*, long long*, uint4*);
  };
  const Pattern patterns[] = {{"rows as packed, word tails", &spread, y_read_kernel<true>},
                              {"rows as packed, vectors only", &spread, y_read_kernel<false>},
                              {"rows together, word tails", &packed, y_read_kernel<true>},
                              {"rows together, vectors only", &packed, y_read_kernel<false>}};
  for (const Pattern& pattern : patterns) {
    check_cuda(cudaMemcpy(rows, pattern.rows->data(), sizeof(int) * pattern.rows->size(), cudaMemcpyHostToDevice),
               "cudaMemcpy");
    const WarpSpread w = warp_spread(  // from the warm-up on, the rows are in L2
        [&] { pattern.kernel<<<sms, 512>>>(y, rows, cycles, out); }, cycles, warps, clock_khz);
    std::printf("%-30s med %6.3f max %6.3f (%.2f TB/s over the max)\n", pattern.name, w.median_us, w.max_us,
                warps * 8.0 * 1024 / (w.max_us * 1e6));
  }
  cudaFree(rows);
  cudaFree(out);
  cudaFreeHost(cycles);
}

// The LL combine's own-rows phase at T = 128, EP = 2: warp w's token has `count` of its 8 experts' rows here
// (8 random bits' popcount, as a token's 8 experts fall on 2 ranks), listed in a record it loads first
// (records[16 w]: count, then the rows), as the combine loads the dispatch's record. It reduces them as
// y_read_kernel does, kInFlight rows' loads at a time. kTimeRecord: the warp's time includes the record's
// round trip; else it counts from the record's arrival.
template <int kInFlight, bool kTimeRecord>
__global__ void __launch_bounds__(512)
    y_phase_kernel(const uint8_t* y, const int* records, long long* cycles, uint4* out) {
  __shared__ uint32_t sink[16];
  const int w = int(blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32), lane = int(threadIdx.x % 32);
  long long start = clock_now();
  const int word = lane < 9 ? records[16 * w + lane] : 0;
  const int count = __shfl_sync(~0u, word, 0);
  if (!kTimeRecord) start = clock_after(uint32_t(word), sink + threadIdx.x / 32);
  float acc[16] = {};
  add_rows<kInFlight, true>(
      y, w % 14, count, [&](int i) { return __shfl_sync(~0u, word, 1 + i); }, acc);
  record_sums(acc, start, w, sink, cycles, out);
}

// `y`: as y_read_rows's.
void y_phase_rows(int sms, const uint8_t* y, int clock_khz) {
  const int warps = sms * 16;
  std::vector<int> records(std::size_t(warps) * 16, 0);
  uint32_t state = 54321u;
  long long rows_read = 0;
  for (int w = 0; w < warps; ++w) {
    state = state * 1664525u + 1013904223u;
    const int count = __builtin_popcount((state >> 8) & 0xFFu);
    records[16 * w] = count;
    rows_read += count;
    for (int k = 0; k < 8; ++k) {
      state = state * 1664525u + 1013904223u;
      const int r = int((state >> 8) % kYRows);
      records[16 * w + 1 + k] = (r / 8) * 256 + r % 8;
    }
  }
  int* table = nullptr;
  long long* cycles = nullptr;
  uint4* out = nullptr;
  check_cuda(cudaMalloc(&table, sizeof(int) * records.size()), "cudaMalloc");
  check_cuda(cudaMemcpy(table, records.data(), sizeof(int) * records.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
  check_cuda(cudaMallocHost(&cycles, sizeof(long long) * warps), "cudaMallocHost");
  check_cuda(cudaMalloc(&out, sizeof(uint4) * 32 * warps), "cudaMalloc");
  const double bytes = double(rows_read) * 1024;
  std::printf(
      "\nepx-start-probe: the LL combine's own-rows phase, every warp of the grid (0-8 rows a warp, %.1f MB in all, "
      "rows as packed); median over %d launches of the warps' median and maximum, us\n",
      bytes / 1e6, kSpreadLaunches);
  struct Variant {
    const char* name;
    void (*kernel)(const uint8_t*, const int*, long long*, uint4*);
  };
  const Variant variants[] = {{"record, 4 rows in flight", y_phase_kernel<4, true>},
                              {"record, 2 rows in flight", y_phase_kernel<2, true>},
                              {"record, 8 rows in flight", y_phase_kernel<8, true>},
                              {"after the record, 4 in flight", y_phase_kernel<4, false>}};
  for (const Variant& v : variants) {
    const WarpSpread spread = warp_spread(  // from the warm-up on, the rows are in L2
        [&] { v.kernel<<<sms, 512>>>(y, table, cycles, out); }, cycles, warps, clock_khz);
    std::printf("%-30s med %6.3f max %6.3f (%.2f TB/s over the max)\n", v.name, spread.median_us, spread.max_us,
                bytes / (spread.max_us * 1e6));
  }
  cudaFree(table);
  cudaFree(out);
  cudaFreeHost(cycles);
}

// ---- Launch costs: one kernel of the LL grid per graph, events around the launch ----
// Each kernel does nothing but what its row names; `before` (a one-warp kernel with no shared memory,
// as the bench's team barrier) runs untimed ahead of every launch, or the kernel itself does.

__global__ void tiny_kernel() {}

// kId: a function of its own per row, so that each row's attributes (carveout) are its own.
template <int kId>
__global__ void __launch_bounds__(512) empty_grid_kernel() {}

// A parameter block the size of the LL kernels' (~1.5 KB), read by every warp's lane 0 as a chain of
// kParamHops dependent loads, each index the word before it holds: i + 16 (a new 64-byte line every hop)
// or 0 (one line).
constexpr int kParamWords = 384, kParamHops = 8;
struct BigParams {
  uint32_t w[kParamWords];
};
__global__ void __launch_bounds__(512) param_chain_kernel(const __grid_constant__ BigParams p, uint32_t* sink) {
  if (threadIdx.x % 32 != 0) return;
  uint32_t i = 0;
#pragma unroll
  for (int h = 0; h < kParamHops; ++h) i = p.w[i % kParamWords];
  if (i == 0xFFFFFFFFu) *sink = i;  // never: keeps the chain
}

struct LaunchRow {
  const char* name;
  std::function<void(cudaStream_t)> launch;
};

// The median us of one launch of `launch` captured alone in a graph, after before(stream).
double graph_launch_us(const std::function<void(cudaStream_t)>& launch, const std::function<void(cudaStream_t)>& before,
                       int repetitions) {
  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  const Timing t = time_graph(stream, 5, repetitions, launch, before);
  cudaStreamDestroy(stream);
  return t.median_us;
}

void launch_cost_rows(int sms, uint32_t* sink) {
  constexpr int kSmall = 3 << 10, kLarge = 16 << 10;
  const auto allow = [](const void* f, int bytes, int carveout) {
    check_cuda(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), "cudaFuncSetAttribute");
    if (carveout >= 0) {
      check_cuda(cudaFuncSetAttribute(f, cudaFuncAttributePreferredSharedMemoryCarveout, carveout),
                 "cudaFuncSetAttribute");
    }
  };
  allow(reinterpret_cast<const void*>(empty_grid_kernel<1>), kSmall, -1);
  allow(reinterpret_cast<const void*>(empty_grid_kernel<2>), kLarge, -1);
  allow(reinterpret_cast<const void*>(empty_grid_kernel<3>), kLarge, cudaSharedmemCarveoutMaxShared);
  allow(reinterpret_cast<const void*>(empty_grid_kernel<4>), kLarge, cudaSharedmemCarveoutMaxL1);
  BigParams crossing{}, same_line{};
  for (int i = 0; i < kParamWords; ++i) {
    crossing.w[i] = uint32_t(i + 16);
    same_line.w[i] = 0;
  }
  const LaunchRow rows[] = {
      {"empty", [&](cudaStream_t s) { empty_grid_kernel<0><<<sms, 512, 0, s>>>(); }},
      {"3 KB dynamic shared", [&](cudaStream_t s) { empty_grid_kernel<1><<<sms, 512, kSmall, s>>>(); }},
      {"16 KB dynamic shared", [&](cudaStream_t s) { empty_grid_kernel<2><<<sms, 512, kLarge, s>>>(); }},
      {"16 KB, carveout max shared", [&](cudaStream_t s) { empty_grid_kernel<3><<<sms, 512, kLarge, s>>>(); }},
      {"16 KB, carveout max L1", [&](cudaStream_t s) { empty_grid_kernel<4><<<sms, 512, kLarge, s>>>(); }},
      {"params: 8 hops, one line", [&](cudaStream_t s) { param_chain_kernel<<<sms, 512, 0, s>>>(same_line, sink); }},
      {"params: 8 hops, 8 lines", [&](cudaStream_t s) { param_chain_kernel<<<sms, 512, 0, s>>>(crossing, sink); }},
  };
  constexpr int kRepetitions = 200;
  const auto after_tiny = [](cudaStream_t s) { tiny_kernel<<<1, 32, 0, s>>>(); };
  std::printf(
      "\nepx-start-probe: one kernel of %d CTAs of 512 threads per graph, events around the launch; median us "
      "of %d launches\n%-28s | %-18s | %-18s\n",
      sms, kRepetitions, "kernel", "after a tiny kernel", "after itself");
  for (const LaunchRow& r : rows) {
    const double tiny = graph_launch_us(r.launch, after_tiny, kRepetitions);
    const double itself = graph_launch_us(r.launch, r.launch, kRepetitions);
    std::printf("%-28s | %18.3f | %18.3f\n", r.name, tiny, itself);
  }
}

// Every section in turn, on device 0.
void run() {
  int device = 0;
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  int clock_khz = 0;
  check_cuda(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device), "cudaDeviceGetAttribute");
  const int sms = device_sm_count(device);
  uint32_t *words = nullptr, *sweep = nullptr, *sink = nullptr;
  long long* out = nullptr;
  check_cuda(cudaMalloc(&words, kFarBytes + kPageBytes * 64), "cudaMalloc");
  check_cuda(cudaMalloc(&sweep, kSweepBytes), "cudaMalloc");
  check_cuda(cudaMalloc(&sink, sizeof(uint32_t)), "cudaMalloc");
  check_cuda(cudaMemset(words, 0, kFarBytes + kPageBytes * 64), "cudaMemset");
  check_cuda(cudaMemset(sweep, 0, kSweepBytes), "cudaMemset");
  check_cuda(cudaMallocHost(&out, sizeof(long long) * (kPoints + 2)), "cudaMallocHost");
  const uint32_t pick = 0x5A5A5A5Au;
  std::size_t far_word = 0;
  const auto probe = [&]() {
    far_word += kPageBytes / 4 / 64;  // a word of the next far page: none read before
    probe_kernel<<<1, 32>>>(words, far_word, pick, out);
    check_cuda(cudaDeviceSynchronize(), "probe");
    std::vector<double> us(kPoints);
    for (int i = 0; i + 1 < kPoints; ++i) us[i] = double(out[i + 1] - out[i]) / (clock_khz / 1e3);
    us[kPoints - 1] = double(out[kPoints - 1] - out[0]) / double(out[kPoints]) * 1e3;  // MHz while it ran
    return us;
  };
  const char* names[] = {"first load",  "second load, same page", "load, new page", "code pass 1",
                         "code pass 2", "clock seen (MHz)"};
  Row rows[] = {{"probe after itself", {}}, {"after other code", {}}, {"after a page sweep", {}}};
  constexpr int kRepeats = 11;
  probe();
  for (int rep = 0; rep < kRepeats; ++rep) {
    probe();
    rows[0].us.push_back(probe());
    other_code_kernel<1><<<1, 32>>>(pick, sink);
    rows[1].us.push_back(probe());
    sweep_kernel<<<sms, 256>>>(sweep, kSweepBytes);
    rows[2].us.push_back(probe());
  }
  std::printf(
      "epx-start-probe: one warp, clock64 at the device's clock rate (%d MHz); median [min, max] of %d "
      "launches, us\n",
      clock_khz / 1000, kRepeats);
  std::printf("%-22s", "condition");
  for (const char* n : names) std::printf(" | %-24s", n);
  std::printf("\n");
  for (Row& r : rows) {
    std::printf("%-22s", r.name);
    for (int i = 0; i < kPoints; ++i) {
      std::vector<double> v;
      for (auto& launch : r.us) v.push_back(launch[i]);
      const Timing t = summarize(std::move(v));
      std::printf(" | %6.3f [%6.3f, %6.3f]  ", t.median_us, t.min_us, t.max_us);
    }
    std::printf("\n");
  }
  // Operation latencies (op_latency_kernel): the median of kRepeats launches.
  double* op_cycles = nullptr;
  check_cuda(cudaMallocHost(&op_cycles, sizeof(double) * int(ChainOp::count)), "cudaMallocHost");
  std::vector<std::vector<double>> per_op(int(ChainOp::count));
  const uint32_t divisor = 144;  // E_local at E = 288, R = 2
  for (int rep = 0; rep < kRepeats; ++rep) {
    op_latency_kernel<<<1, 32>>>(pick + rep, divisor, Divisor::of(divisor), op_cycles);
    check_cuda(cudaDeviceSynchronize(), "op_latency_kernel");
    for (int i = 0; i < int(ChainOp::count); ++i) per_op[i].push_back(op_cycles[i]);
  }
  std::printf(
      "\nepx-start-probe: one warp, a chain of %d dependent steps per operation, cycles per step (median "
      "of %d launches; each step also adds and XORs, the baseline's own cost)\n",
      kChainOps, kRepeats);
  for (int i = 0; i < int(ChainOp::count); ++i) {
    std::sort(per_op[i].begin(), per_op[i].end());
    std::printf("%-22s %7.1f\n", kChainOpNames[i], per_op[i][per_op[i].size() / 2]);
  }
  cudaFreeHost(op_cycles);
  launch_cost_rows(sms, sink);
  first_load_rows(sms, words, sweep, clock_khz);
  item_work_rows(sms, words, clock_khz);
  y_read_rows(sms, reinterpret_cast<const uint8_t*>(sweep), clock_khz);
  y_phase_rows(sms, reinterpret_cast<const uint8_t*>(sweep), clock_khz);
  cudaFree(words);
  cudaFree(sweep);
  cudaFree(sink);
  cudaFreeHost(out);
}

}  // namespace

int main() {
  try {
    run();
  } catch (const std::exception& e) {  // a failed CUDA call (epx::Error, naming it)
    std::fprintf(stderr, "epx-start-probe: %s\n", e.what());
    return 1;
  }
  return 0;
}
