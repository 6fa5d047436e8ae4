#pragma once

#include <memory>

#include "transport/team_impl.hpp"

namespace epx::transport {

class SingleGpuGroup;

std::shared_ptr<SingleGpuGroup> make_single_gpu_group(int nranks);
std::unique_ptr<Backend> make_single_gpu_backend(std::shared_ptr<SingleGpuGroup> group, int rank);

}  // namespace epx::transport
