#pragma once

#include <memory>

#include "epx/team.hpp"
#include "transport/team_impl.hpp"

namespace epx::transport {

UniqueId nccl_unique_id();
std::unique_ptr<Backend> make_nccl_backend(const UniqueId& id, int rank, int nranks);

}  // namespace epx::transport
