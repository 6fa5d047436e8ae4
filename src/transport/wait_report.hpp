#pragma once

#include <string>

#include "transport/device/team_view.hpp"

namespace epx::transport {

const char* phase_name(WaitPhase phase);
// Whether the phase's waits are for a stamped word (WaitReport::expected).
bool waits_for_stamp(WaitPhase phase);
// "timed out after 5000.0 ms in <phase> (detail 3) waiting for rank 1: expected a flag >= 12, saw 11";
// for a stamped word, "expected call stamp 0 with a value >= 1, saw call stamp 4294967295 with value 100".
std::string describe(const WaitReport& report);

}  // namespace epx::transport
