// Memory: a thousand HtBuffers and a thousand LlBuffers (250 of each on teams of more than 4 ranks) made
// and destroyed one after the other on the world team leave the GPU's free memory, the process's open file descriptors
// and its threads where a warm-up's cycles left them, and every buffer holds the bytes that its sizing functions
// predict. Two option sets alternate (64 and 32 experts: 32 must divide among the ranks), so that memory kept per size,
// which the next buffer of the same size would simply reuse, shows too.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <filesystem>
#include <iterator>
#include <string>

#include "epx/ht.hpp"
#include "epx/ll.hpp"
#include "gpu_test_env.hpp"

namespace epx::test {
namespace {

// NCCL, the CUDA runtime and the kernels' modules allocate on first use; after these cycles every
// cycle should give back all it took.
constexpr int kWarmupCycles = 20;

// A cycle's time grows faster than the team: NCCL's window registration and release took 5 ms a cycle
// on 2 H200s, 24 ms on 4 and 133 ms on 8 (2026-11-22), so a thousand cycles on 8 ranks took 133 s.
// There a quarter of them still finds a leaked buffer within 17 cycles, and a leak of 134 KiB a cycle.
int cycles() { return rank_info().world_size <= 4 ? 1000 : 250; }

// Free device memory moves between cycles by a few 2 MiB pages (the driver keeps or returns pages it
// carves small allocations from; up to 12 MiB was seen on H200, 2026-11-22), so what is compared is
// where the last cycle leaves it against where the warm-up left it, with 32 MiB of slack: a leaked
// buffer (its symmetric memory alone is at least one page) exceeds that within 17 cycles, and a leak
// of 34 KiB a cycle within the thousand.
constexpr std::size_t kDeviceSlack = std::size_t(32) << 20;
// Slack for what runs beside the test's thread: NCCL's service threads open and close sockets of their
// own (to pass memory handles between the processes), which a sample may catch. A leak of one
// descriptor or thread per cycle exceeds it by far.
constexpr long kDescriptorSlack = 4;
constexpr long kThreadSlack = 2;

// What the process holds between two cycles.
struct Holdings {
  std::size_t free_device_bytes = 0;
  long open_descriptors = 0;
  long threads = 0;
};

long entries(const char* directory) {
  return long(std::distance(std::filesystem::directory_iterator(directory), std::filesystem::directory_iterator()));
}

// Adds no device-wide synchronisation to the loop (cudaMemGetInfo reads the driver's accounting): on a
// single-GPU team one would wait for the other ranks' kernels.
Holdings holdings() {
  Holdings h;
  std::size_t total = 0;
  EXPECT_EQ(cudaMemGetInfo(&h.free_device_bytes, &total), cudaSuccess);
  h.open_descriptors = entries("/proc/self/fd");  // counts the iterator's own descriptor every time
  h.threads = entries("/proc/self/task");
  return h;
}

// Growth only: giving back more than the warm-up held (memory the driver returned late) is no leak.
// `trend` lists free device memory every 250 cycles, for the message.
void expect_no_growth(const Holdings& now, const Holdings& warm, const std::string& trend) {
  EXPECT_LE(warm.free_device_bytes, now.free_device_bytes + kDeviceSlack)
      << "rank " << rank_info().rank << ": free device memory " << now.free_device_bytes << " bytes after " << cycles()
      << " cycles, " << warm.free_device_bytes << " after the warm-up; every 250 cycles:" << trend;
  EXPECT_LE(now.open_descriptors, warm.open_descriptors + kDescriptorSlack)
      << "rank " << rank_info().rank << ": " << now.open_descriptors << " open file descriptors, "
      << warm.open_descriptors << " after the warm-up";
  EXPECT_LE(now.threads, warm.threads + kThreadSlack)
      << "rank " << rank_info().rank << ": " << now.threads << " threads, " << warm.threads << " after the warm-up";
}

// Runs `cycle(team, i)` (make a buffer, check it, destroy it) kWarmupCycles + cycles() times, then
// compares the holdings with the warm-up's. Every cycle runs even after a failure: making a buffer is
// collective, and NCCL would wait without a bound for a rank that stopped early.
template <typename Cycle>
void create_and_destroy(Cycle cycle) {
  Team& team = world_team();
  Holdings warm;
  std::string trend;
  for (int i = 0; i < kWarmupCycles + cycles(); ++i) {
    cycle(team, i);
    if (i == kWarmupCycles - 1) warm = holdings();
    if (i >= kWarmupCycles && (i - kWarmupCycles + 1) % 250 == 0) {
      trend += ' ';
      trend += std::to_string(holdings().free_device_bytes);
    }
  }
  expect_no_growth(holdings(), warm, trend);
}

TEST(Memory, HtBufferCreateDestroyCycles) {
  EPX_REQUIRE_WORLD_SIZE(2);
  const HtBufferOptions options[2] = {{256, 2048, 8, 64}, {64, 1024, 4, 32}};
  if (options[1].num_experts % rank_info().world_size != 0) GTEST_SKIP() << "the experts do not divide among the ranks";
  std::size_t first_bytes[2] = {0, 0};
  create_and_destroy([&](Team& team, int i) {
    const HtBufferOptions& o = options[i % 2];
    const HtBuffer buffer(team, o);
    if (::testing::Test::HasFailure()) return;
    const std::size_t bytes = buffer.buffer_bytes();
    // required_bytes counts the symmetric areas and the combine output. The buffer also holds its
    // handle blocks and two counters, which no public function predicts: more, never less, and the
    // same for the same options every time.
    EXPECT_GT(bytes, 0u);
    EXPECT_GE(bytes, HtBuffer::required_bytes(o, team.size())) << "cycle " << i;
    std::size_t& first = first_bytes[i % 2];
    if (first == 0) first = bytes;
    EXPECT_EQ(bytes, first) << "cycle " << i << ": the same options gave another buffer_bytes()";
  });
}

TEST(Memory, LlBufferCreateDestroyCycles) {
  EPX_REQUIRE_WORLD_SIZE(2);
  const LlBufferOptions options[2] = {{128, 2048, 8, 64}, {32, 1024, 4, 32}};
  if (options[1].num_experts % rank_info().world_size != 0) GTEST_SKIP() << "the experts do not divide among the ranks";
  create_and_destroy([&](Team& team, int i) {
    const LlBufferOptions& o = options[i % 2];
    LlBuffer buffer(team, o);
    if (::testing::Test::HasFailure()) return;
    // ll.hpp: required_bytes is what buffer_bytes() reports until combine_buffer() is first asked for,
    // which then adds its [E_local * C][H_max] bf16. Every other pair of cycles asks for it, so its
    // lazy allocation is freed with the buffer too.
    const std::size_t required = LlBuffer::required_bytes(o, team.size());
    EXPECT_GT(required, 0u);
    EXPECT_EQ(buffer.buffer_bytes(), required) << "cycle " << i;
    if ((i / 2) % 2 == 0) {
      const TensorRef y = buffer.combine_buffer();
      EXPECT_EQ(buffer.buffer_bytes(), required + std::size_t(y.rows) * std::size_t(y.cols) * 2) << "cycle " << i;
    }
  });
}

}  // namespace
}  // namespace epx::test
