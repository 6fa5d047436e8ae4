#include "transport/wait_report.hpp"

#include <atomic>
#include <cstdio>

namespace epx::transport {

const char* phase_name(WaitPhase phase) {
  switch (phase) {
    case WaitPhase::none:
      return "no phase";
    case WaitPhase::barrier:
      return "team barrier";
    case WaitPhase::test_signal:
      return "transport test signal";
    case WaitPhase::ht_layout:
      return "HT layout: an earlier tile's counts";
    case WaitPhase::ht_notify:
      return "HT dispatch count exchange";
    case WaitPhase::ht_dispatch_done:
      return "HT dispatch rows (a source CTA's done word)";
    case WaitPhase::ht_combine_ready:
      return "HT combine handshake";
    case WaitPhase::ht_combine_done:
      return "HT combine: a home rank CTA's reads of my input (its done word)";
    case WaitPhase::ht_bulk_load:
      return "HT bulk row load";
    case WaitPhase::ll_dispatch_recv:
      return "LL dispatch words";
    case WaitPhase::ll_combine_recv:
      return "LL combine rows";
    case WaitPhase::ll_set_reuse:
      return "LL buffer set reuse";
    case WaitPhase::ll_combine_weights:
      return "LL combine weights (a home rank's)";
  }
  return "unknown phase";
}

bool waits_for_stamp(WaitPhase phase) {
  return phase == WaitPhase::ht_notify || phase == WaitPhase::ht_combine_ready ||
         phase == WaitPhase::ht_dispatch_done || phase == WaitPhase::ht_combine_done;
}

std::string describe(const WaitReport& report) {
  if (std::atomic_ref<const uint32_t>(report.complete).load() == 0u) {
    return "a device wait timed out, but its report was not complete (the kernel may still be running)";
  }
  const auto phase = static_cast<WaitPhase>(report.phase);
  char what[160];
  if (phase == WaitPhase::ll_dispatch_recv || phase == WaitPhase::ll_combine_recv ||
      phase == WaitPhase::ll_combine_weights) {  // LL stamps: the high half
    std::snprintf(what, sizeof what, "expected a word of call stamp %u, saw stamp %u (data %u)",
                  unsigned(report.expected >> 32), unsigned(report.observed >> 32),
                  unsigned(report.observed & 0xFFFFFFFFu));
  } else if (waits_for_stamp(phase)) {  // the halves of a stamped word (core::stamped)
    std::snprintf(what, sizeof what, "expected call stamp %u with a value >= %u, saw call stamp %u with value %u",
                  unsigned(report.expected >> 32), unsigned(report.expected & 0xFFFFFFFFu),
                  unsigned(report.observed >> 32), unsigned(report.observed & 0xFFFFFFFFu));
  } else {
    std::snprintf(what, sizeof what, "expected a flag >= %llu, saw %llu",
                  static_cast<unsigned long long>(report.expected), static_cast<unsigned long long>(report.observed));
  }
  char text[400];
  const double ms = static_cast<double>(report.waited_ns) / 1e6;
  const std::string whom = report.peer >= 0 ? "rank " + std::to_string(report.peer) : std::string("its peers");
  std::snprintf(text, sizeof text,
                "rank %d timed out after %.1f ms in %s (detail %u) waiting for %s: %s "
                "(is that rank alive and running the same operation?)",
                report.rank, ms, phase_name(phase), report.detail, whom.c_str(), what);
  return text;
}

}  // namespace epx::transport
