// libFuzzer target over the host-side code every call runs before launching anything: the argument
// checks (core/validate) and the HT and LL buffer sizing (core/ht_areas, core/ll_areas). For any input
// they must either accept or throw epx::Error, never crash; what they accept must satisfy the
// invariants the kernels rely on. Run by scripts/fuzz.sh (CI runs it for a bounded time).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/ht_areas.hpp"
#include "core/validate.hpp"
#include "epx/error.hpp"
#include "support/ht_areas_invariants.hpp"
#include "support/ll_areas_invariants.hpp"

namespace {

// Reads fixed-size values from the fuzzer's bytes (zeros once they run out).
struct Reader {
  const uint8_t* data;
  std::size_t size;
  template <typename T>
  T next() {
    T value{};
    const std::size_t n = size < sizeof(T) ? size : sizeof(T);
    std::memcpy(&value, data, n);
    data += n;
    size -= n;
    return value;
  }
};

void require(bool condition) {
  if (!condition) std::abort();  // an invariant broke: the fuzzer reports the input
}

void fuzz_check_tensor(Reader& in) {
  epx::TensorRef t;
  t.data = reinterpret_cast<void*>(in.next<uint64_t>() & 0xffffffffffffull);
  t.type = static_cast<epx::ScalarType>(in.next<uint8_t>() % 6);
  t.rows = in.next<int32_t>();
  t.cols = in.next<int32_t>();
  t.row_stride = in.next<int32_t>();
  t.col_stride = in.next<int32_t>();
  const uint8_t flags = in.next<uint8_t>();
  const bool dense = flags & 1;
  const int alignment = 1 << (in.next<uint8_t>() % 6);
  const int64_t rows = (flags & 2) ? in.next<int16_t>() : -1;
  const int64_t cols = (flags & 4) ? in.next<int16_t>() : -1;
  const epx::core::Expect expect{"fuzzed", {epx::ScalarType::bf16, epx::ScalarType::int64}, rows, cols, dense,
                                 alignment};
  try {
    epx::core::check_tensor(t, expect);
  } catch (const epx::Error& e) {
    require(e.kind() == epx::ErrorKind::invalid_argument);
    return;
  }
  // Accepted: the promises the kernels rely on.
  require(t.type == epx::ScalarType::bf16 || t.type == epx::ScalarType::int64);
  require(t.rows >= 0 && t.cols >= 0);
  require(rows < 0 || t.rows == rows);
  require(cols < 0 || t.cols == cols);
  if (t.rows == 0 || t.cols == 0) return;
  const int element = epx::element_size(t.type);
  require(t.data != nullptr);
  require(reinterpret_cast<uintptr_t>(t.data) % alignment == 0 && reinterpret_cast<uintptr_t>(t.data) % element == 0);
  if (dense) require(t.col_stride == 1 && (t.rows == 1 || t.row_stride >= t.cols));
  if (!dense) require(t.row_stride > 0 && t.col_stride > 0);
  if (t.rows > 1) require((int64_t(t.row_stride) * element) % alignment == 0);
}

void fuzz_ht_areas(Reader& in) {
  epx::HtBufferOptions o;
  o.max_tokens_per_rank = 1 + in.next<uint16_t>() % 8192;
  o.hidden = 128 * (1 + in.next<uint8_t>() % 128);
  o.max_topk = 1 + in.next<uint8_t>() % 32;
  const int R = 1 + in.next<uint8_t>() % epx::kMaxNvlinkRanks;
  o.num_experts = R * (1 + in.next<uint8_t>() % 64);
  require(epx::test::broken_ht_areas_invariant(epx::core::ht_areas(o, R), o, R).empty());
}

void fuzz_ll_areas(Reader& in) {
  epx::LlBufferOptions o;
  o.max_tokens_per_rank = 1 + in.next<uint16_t>() % epx::core::kLlMaxTokens;
  o.hidden = 128 * (1 + in.next<uint8_t>() % (epx::core::kLlMaxHidden / 128));
  o.max_topk = 1 + in.next<uint8_t>() % epx::core::kLlMaxTopk;
  const int R = 1 + in.next<uint8_t>() % epx::kMaxNvlinkRanks;
  o.num_experts = R * (1 + in.next<uint8_t>() % (epx::core::kLlMaxExperts / R));
  require(epx::test::broken_ll_areas_invariant(o, R).empty());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  Reader in{data + 1, size - 1};
  switch (data[0] % 3) {
    case 0:
      fuzz_check_tensor(in);
      break;
    case 1:
      fuzz_ht_areas(in);
      break;
    default:
      fuzz_ll_areas(in);
  }
  return 0;
}
