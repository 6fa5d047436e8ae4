#pragma once

#include <string>

#include "transport/device/team_view.hpp"

namespace epx::transport {

const char* phase_name(WaitPhase phase);
// "timed out after 5000.0 ms in <phase> (detail 3) waiting for rank 1: expected a flag >= 12, saw 11"
std::string describe(const WaitReport& report);

}  // namespace epx::transport
