// The public C++ API of epx in one include.
#pragma once

#include "epx/error.hpp"
#include "epx/team.hpp"
#include "epx/version.hpp"
