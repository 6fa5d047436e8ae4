#include "launcher/launcher.hpp"

#include <cuda_runtime_api.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/cuda_check.hpp"
#include "core/rank_context.hpp"

namespace epx::launch {
namespace {

// Variables the launcher passes to its children.
constexpr const char* kChildRank = "EPX_LAUNCH_RANK";
constexpr const char* kChildWorld = "EPX_LAUNCH_WORLD_SIZE";
constexpr const char* kChildId = "EPX_LAUNCH_UNIQUE_ID";

int parse_int(const char* name, const char* text) {
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || value < 0 || value > 1'000'000) {
    detail::fail(ErrorKind::invalid_argument,
                 std::string("environment variable ") + name + "='" + text + "' is not a non-negative integer");
  }
  return static_cast<int>(value);
}

const char* env(const char* name) { return std::getenv(name); }

bool read_child_environment(RankInfo& out) {
  if (env(kChildRank) == nullptr) return false;
  out.rank = parse_int(kChildRank, env(kChildRank));
  out.world_size = parse_int(kChildWorld, env(kChildWorld) ? env(kChildWorld) : "");
  out.local_rank = out.rank;
  return true;
}

// The environment of child `rank`: ours plus the three launcher variables. Built before fork(), because
// between fork() and exec() a child of a multi-threaded process may only make async-signal-safe calls.
std::vector<std::string> child_environment(int rank, int world, const std::string& id_hex) {
  std::vector<std::string> entries;
  for (char** e = environ; *e != nullptr; ++e) entries.emplace_back(*e);
  entries.push_back(std::string(kChildRank) + "=" + std::to_string(rank));
  entries.push_back(std::string(kChildWorld) + "=" + std::to_string(world));
  entries.push_back(std::string(kChildId) + "=" + id_hex);
  return entries;
}

std::vector<char*> pointers_to(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (auto& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

int exit_status_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// Waits for every child. After the first failure the rest get `grace`, then SIGKILL.
int wait_for_children(std::vector<pid_t> children, std::chrono::seconds grace) {
  int result = 0;
  bool failed = false;
  auto deadline = std::chrono::steady_clock::time_point::max();
  std::size_t alive = children.size();
  while (alive > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (std::size_t r = 0; r < children.size(); ++r) {
        if (children[r] != pid) continue;
        children[r] = -1;
        --alive;
        const int code = exit_status_of(status);
        if (code != 0 && !failed) {
          failed = true;
          result = code;
          deadline = std::chrono::steady_clock::now() + grace;
          std::fprintf(stderr, "epx launcher: rank %zu exited with status %d; the others have %lld s to finish\n", r,
                       code, static_cast<long long>(grace.count()));
        }
      }
      continue;
    }
    if (pid < 0 && errno != EINTR) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (std::size_t r = 0; r < children.size(); ++r) {
        if (children[r] <= 0) continue;
        std::fprintf(stderr, "epx launcher: killing rank %zu, still running after another rank failed\n", r);
        kill(children[r], SIGKILL);
      }
      deadline = std::chrono::steady_clock::time_point::max();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return result;
}

}  // namespace

std::string encode_unique_id(const UniqueId& id) {
  static const char* digits = "0123456789abcdef";
  std::string hex;
  for (char c : id.bytes) {
    const auto byte = static_cast<unsigned char>(c);
    hex += digits[byte >> 4];
    hex += digits[byte & 15];
  }
  return hex;
}

UniqueId decode_unique_id(const std::string& hex) {
  UniqueId id;
  EPX_REQUIRE(hex.size() == 2 * id.bytes.size(), "a unique id has " + std::to_string(2 * id.bytes.size()) +
                                                     " hex digits, got " + std::to_string(hex.size()));
  auto nibble = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    detail::fail(ErrorKind::invalid_argument, std::string("bad hex digit '") + c + "' in a unique id");
  };
  for (std::size_t i = 0; i < id.bytes.size(); ++i) {
    id.bytes[i] = static_cast<char>(nibble(hex[2 * i]) << 4 | nibble(hex[2 * i + 1]));
  }
  return id;
}

bool read_torchrun_environment(RankInfo& out) {
  if (env("RANK") == nullptr) return false;
  for (const char* name : {"WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}) {
    EPX_REQUIRE(env(name) != nullptr, std::string("RANK is set but ") + name +
                                          " is not: set all of RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT");
  }
  out.rank = parse_int("RANK", env("RANK"));
  out.world_size = parse_int("WORLD_SIZE", env("WORLD_SIZE"));
  out.local_rank = parse_int("LOCAL_RANK", env("LOCAL_RANK"));
  EPX_REQUIRE(out.world_size >= 1 && out.rank < out.world_size,
              "RANK=" + std::to_string(out.rank) + " is not below WORLD_SIZE=" + std::to_string(out.world_size));
  const int port = parse_int("MASTER_PORT", env("MASTER_PORT"));
  EPX_REQUIRE(port > 0 && port < 65535, "MASTER_PORT=" + std::to_string(port) + " is not a usable port");
  if (env("NCCL_COMM_ID") == nullptr) {
    const std::string comm_id = std::string(env("MASTER_ADDR")) + ":" + std::to_string(port + 1);
    setenv("NCCL_COMM_ID", comm_id.c_str(), 1);
  }
  return true;
}

Start start(int /*argc*/, char** argv, const Options& options) {
  Start result;
  if (read_torchrun_environment(result.rank) || read_child_environment(result.rank)) {
    result.role = Role::rank;
    return result;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    result.role = Role::no_gpu;
    return result;
  }
  const std::string id_hex = encode_unique_id(Team::make_unique_id());
  std::vector<std::string> command;
  for (char** a = argv; *a != nullptr; ++a) command.emplace_back(*a);
  result.role = Role::launcher;
  result.exit_code = run_ranks("/proc/self/exe", command, devices, id_hex, options.grace);
  return result;
}

int run_ranks(const std::string& program, const std::vector<std::string>& argv, int ranks, const std::string& id_hex,
              std::chrono::seconds grace) {
  std::vector<std::string> arguments = argv;
  std::vector<char*> args = pointers_to(arguments);
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> children;
  for (int r = 0; r < ranks; ++r) {
    std::vector<std::string> environment = child_environment(r, ranks, id_hex);
    std::vector<char*> envp = pointers_to(environment);
    const pid_t pid = fork();
    if (pid < 0) detail::fail(ErrorKind::system, std::string("fork failed: ") + std::strerror(errno));
    if (pid == 0) {
      execve(program.c_str(), args.data(), envp.data());
      _exit(127);  // exec failed; the launcher reports status 127 for this rank
    }
    children.push_back(pid);
  }
  return wait_for_children(std::move(children), grace);
}

std::unique_ptr<Team> make_team(const RankInfo& rank, const TeamOptions& options) {
  detail::ScopedRank scoped(rank.rank);
  detail::check_cuda(cudaSetDevice(rank.local_rank), "cudaSetDevice(LOCAL_RANK)");
  UniqueId id;
  if (const char* hex = env(kChildId)) {
    id = decode_unique_id(hex);
  } else {
    id = Team::make_unique_id();  // derived from NCCL_COMM_ID (see the header): the same on every rank
  }
  return Team::create_nccl(id, rank.rank, rank.world_size, options);
}

}  // namespace epx::launch
