// epx-bench: measures epx on every local GPU (one process each, started by the bench itself) or as one
// rank of a torchrun-style job, next to the physical limits measured in the same run, and writes the
// JSON of DESIGN.md §3.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <string>

#include "bench/json_writer.hpp"
#include "bench/limits.hpp"
#include "epx/version.hpp"
#include "launcher/launcher.hpp"

namespace epx::bench {
namespace {

struct Args {
  std::string json_path = "epx-bench.json";
  std::string device_kind;  // a name for the machine in the JSON, e.g. nvidia-h200-x2
  std::string commit;
  int timeout_ms = 5000;
};

void usage() {
  std::printf(
      "usage: epx-bench [--json FILE] [--device-kind NAME] [--commit SHA] [--timeout-ms N]\n"
      "  Runs on every local GPU, one process each (or as one rank under torchrun-style RANK/WORLD_SIZE/\n"
      "  LOCAL_RANK/MASTER_ADDR/MASTER_PORT), measures the NVLink limits and writes FILE (default %s).\n",
      Args{}.json_path.c_str());
}

Args parse(int argc, char** argv) {
  Args args;
  if (const char* commit = std::getenv("EPX_COMMIT")) args.commit = commit;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "epx-bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--json")
      args.json_path = value();
    else if (a == "--device-kind")
      args.device_kind = value();
    else if (a == "--commit")
      args.commit = value();
    else if (a == "--timeout-ms")
      args.timeout_ms = std::atoi(value().c_str());
    else if (a == "--help" || a == "-h") {
      usage();
      std::exit(0);
    } else {
      std::fprintf(stderr, "epx-bench: unknown argument %s\n", a.c_str());
      usage();
      std::exit(2);
    }
  }
  return args;
}

std::string today() {
  char text[16];
  const std::time_t now = std::time(nullptr);
  std::strftime(text, sizeof text, "%Y-%m-%d", std::gmtime(&now));
  return text;
}

std::string device_description(int ranks) {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return "unknown";
  return std::to_string(ranks) + "x " + prop.name;
}

void write_json(const Args& args, int ranks, const Limits& limits) {
  JsonWriter j;
  j.begin_object()
      .field("device", args.device_kind.empty() ? device_description(ranks) : args.device_kind)
      .field("date", today())
      .field("commit", args.commit.empty() ? std::string("unknown") : args.commit)
      .field("epx_version", EPX_VERSION_STRING)
      .field("ranks", ranks);
  j.begin_object("limits")
      .field("nvlink_measured", limits.measured_nvlink)
      .field("nvlink_sm_store_gbps", limits.nvlink_sm_store_gbps)
      .field("nvlink_sm_store_blocks", limits.nvlink_sm_store_blocks)
      .field("nvlink_sm_store_16_blocks_gbps", limits.nvlink_sm_store_16_blocks_gbps)
      .field("nvlink_copy_engine_gbps", limits.nvlink_copy_engine_gbps)
      .field("flag_latency_us", limits.flag_latency_us)
      .field("empty_graph_kernel_us", limits.empty_graph_kernel_us)
      .field("hbm_copy_gbps", limits.hbm_copy_gbps)
      .field("data_checked", limits.data_checked)
      .end_object();
  j.begin_array("results").end_array();
  j.end_object();
  std::ofstream out(args.json_path);
  out << j.str() << "\n";
  if (!out) {
    std::fprintf(stderr, "epx-bench: cannot write %s\n", args.json_path.c_str());
    std::exit(1);
  }
}

void print_table(int ranks, const Limits& l) {
  std::printf("\nepx-bench, %d rank(s)\n", ranks);
  std::printf("%-44s %12s\n", "limit", "value");
  if (l.measured_nvlink) {
    std::printf("%-44s %9.1f GB/s\n",
                ("NVLink SM stores, per direction (" + std::to_string(l.nvlink_sm_store_blocks) + " CTAs)").c_str(),
                l.nvlink_sm_store_gbps);
    std::printf("%-44s %9.1f GB/s\n", "NVLink SM stores, per direction (16 CTAs)", l.nvlink_sm_store_16_blocks_gbps);
    std::printf("%-44s %9.1f GB/s\n", "NVLink copy engine, per direction", l.nvlink_copy_engine_gbps);
    std::printf("%-44s %9.2f us\n", "flag latency, one way", l.flag_latency_us);
    std::printf("%-44s %12s\n", "NVLink data checked", l.data_checked ? "yes" : "NO");
  } else {
    std::printf("%-44s %12s\n", "NVLink limits", "n/a: 1 GPU");
  }
  std::printf("%-44s %9.2f us\n", "empty kernel from a CUDA graph", l.empty_graph_kernel_us);
  std::printf("%-44s %9.1f GB/s\n", "HBM device-to-device copy (read + write)", l.hbm_copy_gbps);
  std::printf("\n(dispatch/combine benchmarks: none built yet)\n");
}

int run(int argc, char** argv) {
  const Args args = parse(argc, argv);
  const launch::Start start = launch::start(argc, argv);
  if (start.role == launch::Role::launcher) return start.exit_code;
  if (start.role == launch::Role::no_gpu) {
    std::printf(
        "epx-bench: no GPU is visible on this machine, so nothing was measured.\n"
        "Run it on a machine with NVIDIA Hopper GPUs (all local GPUs are used, one process each).\n");
    return 2;
  }
  TeamOptions options;
  options.wait_timeout = std::chrono::milliseconds(args.timeout_ms);
  auto team = launch::make_team(start.rank, options);
  const Limits limits = measure_limits(*team);
  if (team->rank() == 0) {
    print_table(team->size(), limits);
    write_json(args, team->size(), limits);
    std::printf("wrote %s\n", args.json_path.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace epx::bench

int main(int argc, char** argv) {
  try {
    return epx::bench::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "epx-bench: %s\n", e.what());
    return 1;
  }
}
