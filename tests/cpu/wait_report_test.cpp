#include <gtest/gtest.h>

#include <string>

#include "transport/wait_report.hpp"

namespace epx::transport {
namespace {

// A complete report of a wait of 5 s by `rank` for `peer`.
WaitReport complete_report(int rank, int peer, WaitPhase phase, uint32_t detail, uint64_t expected, uint64_t observed) {
  WaitReport report{};
  report.claimed = 1;
  report.complete = 1;
  report.rank = rank;
  report.peer = peer;
  report.phase = static_cast<uint32_t>(phase);
  report.detail = detail;
  report.expected = expected;
  report.observed = observed;
  report.waited_ns = 5'000'000'000ull;
  return report;
}

TEST(WaitReport, DescribesWhoWaitedForWhom) {
  EXPECT_EQ(describe(complete_report(2, 7, WaitPhase::barrier, 3, 12, 11)),
            "rank 2 timed out after 5000.0 ms in team barrier (detail 3) waiting for rank 7: expected a flag >= 12, "
            "saw 11 (is that rank alive and running the same operation?)");
}

TEST(WaitReport, DescribesAStampedWordByItsHalves) {
  // Waiting for call 2^32's stamp (0), any value, and seeing call 2^32 - 1's word.
  const uint64_t previous_call_word = (uint64_t(0xFFFFFFFFu) << 32) | 100u;
  EXPECT_EQ(describe(complete_report(0, 1, WaitPhase::ht_notify, 0, 0, previous_call_word)),
            "rank 0 timed out after 5000.0 ms in HT dispatch count exchange (detail 0) waiting for rank 1: expected "
            "call stamp 0 with a value >= 0, saw call stamp 4294967295 with value 100 (is that rank alive and "
            "running the same operation?)");
  EXPECT_TRUE(waits_for_stamp(WaitPhase::ht_combine_ready));
  EXPECT_TRUE(waits_for_stamp(WaitPhase::ht_dispatch_done));
  EXPECT_TRUE(waits_for_stamp(WaitPhase::ht_combine_done));
  EXPECT_FALSE(waits_for_stamp(WaitPhase::ht_layout));
}

TEST(WaitReport, AnIncompleteReportSaysSo) {
  WaitReport report{};
  report.claimed = 1;
  EXPECT_NE(describe(report).find("not complete"), std::string::npos);
}

TEST(WaitReport, EveryPhaseHasAName) {
  constexpr WaitPhase kLast = WaitPhase::ll_combine_weights;  // the enum's last value: a new phase moves this
  for (uint32_t phase = 0; phase <= static_cast<uint32_t>(kLast); ++phase) {
    EXPECT_STRNE(phase_name(static_cast<WaitPhase>(phase)), "unknown phase") << "phase " << phase;
  }
  EXPECT_STREQ(phase_name(static_cast<WaitPhase>(static_cast<uint32_t>(kLast) + 1)), "unknown phase")
      << "a phase after kLast: move kLast to it";
}

}  // namespace
}  // namespace epx::transport
