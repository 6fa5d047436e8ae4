#include <gtest/gtest.h>

#include <string>

#include "transport/wait_report.hpp"

namespace epx::transport {
namespace {

TEST(WaitReport, DescribesWhoWaitedForWhom) {
  WaitReport report{};
  report.claimed = 1;
  report.complete = 1;
  report.rank = 2;
  report.peer = 7;
  report.phase = static_cast<uint32_t>(WaitPhase::barrier);
  report.detail = 3;
  report.expected = 12;
  report.observed = 11;
  report.waited_ns = 5'000'000'000ull;
  EXPECT_EQ(describe(report),
            "rank 2 timed out after 5000.0 ms in team barrier (detail 3) waiting for rank 7: expected a flag >= 12, "
            "saw 11 (is that rank alive and running the same operation?)");
}

TEST(WaitReport, DescribesAStampedWordByItsHalves) {
  WaitReport report{};
  report.claimed = 1;
  report.complete = 1;
  report.rank = 0;
  report.peer = 1;
  report.phase = static_cast<uint32_t>(WaitPhase::ht_notify);
  report.expected = 0;                                     // call 2^32's stamp, any value
  report.observed = (uint64_t(0xFFFFFFFFu) << 32) | 100u;  // call 2^32 - 1's word
  report.waited_ns = 5'000'000'000ull;
  EXPECT_EQ(describe(report),
            "rank 0 timed out after 5000.0 ms in HT dispatch count exchange (detail 0) waiting for rank 1: expected "
            "call stamp 0 with a value >= 0, saw call stamp 4294967295 with value 100 (is that rank alive and "
            "running the same operation?)");
  EXPECT_TRUE(waits_for_stamp(WaitPhase::ht_combine_ready));
  EXPECT_FALSE(waits_for_stamp(WaitPhase::ht_dispatch_done));
}

TEST(WaitReport, AnIncompleteReportSaysSo) {
  WaitReport report{};
  report.claimed = 1;
  EXPECT_NE(describe(report).find("not complete"), std::string::npos);
}

TEST(WaitReport, EveryPhaseHasAName) {
  constexpr WaitPhase kLast = WaitPhase::ll_set_reuse;  // the enum's last value: a new phase moves this
  for (uint32_t phase = 0; phase <= static_cast<uint32_t>(kLast); ++phase) {
    EXPECT_STRNE(phase_name(static_cast<WaitPhase>(phase)), "unknown phase") << "phase " << phase;
  }
  EXPECT_STREQ(phase_name(static_cast<WaitPhase>(static_cast<uint32_t>(kLast) + 1)), "unknown phase")
      << "a phase after kLast: move kLast to it";
}

}  // namespace
}  // namespace epx::transport
