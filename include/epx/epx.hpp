// The public C++ API of epx in one include.
#pragma once

#include "epx/error.hpp"
#include "epx/ht.hpp"
#include "epx/ll.hpp"
#include "epx/streams.hpp"
#include "epx/team.hpp"
#include "epx/tensor.hpp"
#include "epx/version.hpp"
