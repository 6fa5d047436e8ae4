// Starting a multi-rank program (the bench, the GPU tests) without any external service.
//
// A program calls epx::launch::start() first thing in main. Three cases:
//   1. torchrun-style variables are set (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT):
//      this process is one rank. The NCCL unique id is not sent anywhere: every rank derives it from
//      NCCL_COMM_ID, which start() sets to MASTER_ADDR:(MASTER_PORT + 1) unless it is already set
//      (MASTER_PORT itself belongs to torchrun's own store); rank 0's NCCL listens there.
//   2. this process was started by case 3: it is the rank its parent says, and the unique id came
//      in its environment.
//   3. neither: this process becomes the launcher. It makes the unique id, starts one copy of the
//      same program with the same arguments per visible GPU, waits for all of them, and reports their
//      combined exit status; if one fails, the others get a grace period and are then killed, so a
//      failure never leaves a hung job behind.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "epx/team.hpp"

namespace epx::launch {

struct RankInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;  // the CUDA device this rank uses
};

enum class Role {
  rank,      // this process is one rank: do the work
  launcher,  // the work ran in child processes: exit with exit_code
  no_gpu,    // no GPU is visible: the program should say so and skip its GPU work
};

struct Start {
  Role role = Role::no_gpu;
  int exit_code = 0;  // for Role::launcher
  RankInfo rank;      // for Role::rank
};

struct Options {
  // Time the other ranks get to finish after one has failed, before they are killed.
  std::chrono::seconds grace{30};
};

Start start(int argc, char** argv, const Options& options = {});

// Case 3's mechanics (exposed for tests): runs `program` with `argv` (argv[0] first) as ranks
// 0 .. ranks-1, each with the launcher's variables in its environment, and returns their combined exit
// status: 0, or the first failure's (128 + signal for a signal); after a failure the others get
// `grace`, then SIGKILL.
int run_ranks(const std::string& program, const std::vector<std::string>& argv, int ranks, const std::string& id_hex,
              std::chrono::seconds grace);

// The NCCL team of this rank (sets the CUDA device to rank.local_rank first). Collective.
std::unique_ptr<Team> make_team(const RankInfo& rank, const TeamOptions& options = {});

// Hex form of a unique id, as it travels in the environment (exposed for tests).
std::string encode_unique_id(const UniqueId& id);
UniqueId decode_unique_id(const std::string& hex);

// Reads the torchrun-style variables; returns false if RANK is not set. Throws epx::Error if they are
// set but inconsistent (exposed for tests).
bool read_torchrun_environment(RankInfo& out);

}  // namespace epx::launch
