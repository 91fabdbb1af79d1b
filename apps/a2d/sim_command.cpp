// a2d sim: the engine's own schedule inside SimGrid (SMPI), on the simulated device (sim.hpp).
// Built only in the SMPI build (cmake/A2dSmpi.cmake: build/smpi/a2d); run through sim/run.sh,
// which starts smpirun on a platform of sim/platforms/ (docs/simulation.md):
//
//   sim/run.sh --platform h100-64x1 -np 64 -- --machine h100-ndr --gpus-per-node 1
//       --seq 65536 --heads 40 --head-dim 128 --causal --dtype bf16 --backward
//       --plans attention2d:8x8,attention2d-overlap:8x8,ring --json
//
// Every plan runs through make_attention on the MPI world as a2d run's do; the times are
// SimGrid's clock (the slowest rank's, per phase as the counting communicator names them), beside
// the cost model's prediction for the same plan, machine and ranks per node.
#include <mpi.h>

#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "attention2d/collective.hpp"
#include "attention2d/comm_wrappers.hpp"
#include "attention2d/cost_model.hpp"
#include "attention2d/error.hpp"
#include "attention2d/mpi_comm.hpp"
#include "attention2d/planner.hpp"
#include "attention2d/sim.hpp"
#include "attention2d/tools/cli.hpp"
#include "attention2d/tools/harness.hpp"
#include "commands.hpp"
#include "problem_options.hpp"
#include "run_support.hpp"
#include "sim_options.hpp"

namespace a2d::commands {
namespace {

// HBM bandwidth of the presets' GPUs, from their datasheets: the A100 SXM4 80GB's 2039 GB/s and
// the H100 SXM5's 3.35 TB/s (docs/simulation.md, "The device").
double preset_memory_gbs(const std::string& machine) {
  if (machine == "a100-hdr") return 2039;
  if (machine == "h100-ndr") return 3350;
  return 0;
}

bool same_plan(const Plan& a, const Plan& b) {
  return a.algorithm == b.algorithm && a.grid.rows == b.grid.rows && a.grid.cols == b.grid.cols &&
         a.layout == b.layout && a.stripe == b.stripe && a.kv_transpose == b.kv_transpose &&
         a.heads_parallel == b.heads_parallel;
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> items;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, separator);) {
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

// One entry of --plans: ALGO[:RxC][:uU][:LAYOUT][:nt]. Without a grid, a grid algorithm takes
// the model's fastest plan of that algorithm (over every grid, K/V transpose and, for the
// hybrid, U); with one, its default plan on that grid.
// A plan that cannot run gets the reason in `skipped`; a malformed entry throws.
Plan parse_plan(const std::string& spec, const Problem& problem, int ranks,
                const PlanSearch& search, std::string* skipped) {
  const std::vector<std::string> parts = split(spec, ':');
  A2D_REQUIRE(!parts.empty(), "--plans: an empty entry");
  const Algorithm algorithm = parse_algorithm(parts[0]);
  const AlgorithmTraits& traits = algorithm_traits(algorithm);
  Plan plan = default_plan(algorithm, problem, ranks);
  bool grid_given = false, u_given = false, transpose_given = false;
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& part = parts[i];
    if (part == "nt") {
      A2D_REQUIRE(traits.grid, "--plans ", spec,
                  ": 'nt' (no K/V transpose) needs a grid algorithm");
      plan.kv_transpose = false;
      transpose_given = true;
    } else if (part.find('x') != std::string::npos) {
      A2D_REQUIRE(traits.grid, "--plans ", spec, ": ", traits.name, " has no grid");
      plan.grid = parse_grid(part);
      grid_given = true;
    } else if (part.size() > 1 && part[0] == 'u') {
      A2D_REQUIRE(traits.heads_parallel, "--plans ", spec, ": ", traits.name,
                  " has no heads parallelism");
      plan.heads_parallel = std::stoi(part.substr(1));
      u_given = true;
    } else {
      A2D_REQUIRE(!traits.grid, "--plans ", spec, ": ", traits.name, " takes no layout");
      plan.layout = parse_layout(part);
    }
  }
  if (traits.grid && !grid_given) {
    A2D_REQUIRE(!u_given && !transpose_given, "--plans ", spec,
                ": give the grid with 'u' or 'nt' (ALGO:uU:RxC)");
    for (const RankedPlan& ranked : search.ranked) {
      if (ranked.plan.algorithm == algorithm) return ranked.plan;
    }
    *skipped = "the model finds no plan of " + std::string(traits.name) + " for " +
               std::to_string(ranks) + " ranks";
    for (const auto& [name, reason] : search.skipped) {
      if (name == traits.name) *skipped = reason;
    }
    return plan;
  }
  if (traits.heads_parallel && grid_given && !u_given) {
    A2D_REQUIRE(ranks % plan.grid.size() == 0, "--plans ", spec, ": the grid does not divide ",
                ranks, " ranks");
    plan.heads_parallel = ranks / plan.grid.size();
  }
  return plan;
}

struct SimRow {
  Plan plan;
  std::string spec;
  std::string skipped;
  int planner_rank = -1;  // 1 = the planner's choice; -1: not among the ranked plans
};

// The rows, chosen on rank 0 (the plan search is the model's, the same on every rank: made once
// rather than P times) and sent to every rank: each plan as 8 numbers, and whether it runs.
void broadcast_rows(Communicator& world, std::vector<SimRow>& rows) {
  int64_t count = static_cast<int64_t>(rows.size());
  world.broadcast(&count, sizeof count, 0);
  std::vector<int64_t> packed(static_cast<size_t>(8 * count));
  if (world.rank() == 0) {
    for (size_t i = 0; i < rows.size(); ++i) {
      const Plan& p = rows[i].plan;
      const int64_t fields[8] = {static_cast<int64_t>(p.algorithm),
                                 p.grid.rows,
                                 p.grid.cols,
                                 static_cast<int64_t>(p.layout),
                                 p.stripe,
                                 p.kv_transpose,
                                 p.heads_parallel,
                                 rows[i].skipped.empty()};
      std::copy(fields, fields + 8, packed.begin() + static_cast<std::ptrdiff_t>(8 * i));
    }
  }
  world.broadcast(packed.data(), static_cast<int64_t>(packed.size() * sizeof(int64_t)), 0);
  if (world.rank() == 0) return;
  rows.assign(static_cast<size_t>(count), SimRow{});
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t* f = packed.data() + 8 * i;
    Plan& p = rows[i].plan;
    p.algorithm = static_cast<Algorithm>(f[0]);
    p.grid = GridShape{static_cast<int>(f[1]), static_cast<int>(f[2])};
    p.layout = static_cast<LayoutKind>(f[3]);
    p.stripe = f[4];
    p.kv_transpose = f[5] != 0;
    p.heads_parallel = static_cast<int>(f[6]);
    if (f[7] == 0) rows[i].skipped = "skipped (reason on rank 0)";
  }
}

// The device's charges per phase, the largest over the ranks, per call (phase names as rank 0
// has them; every rank makes the same calls).
std::map<std::string, SimPhaseCharge> slowest_charges(
    Communicator& world, const std::map<std::string, SimPhaseCharge>& mine, int64_t calls) {
  std::string names;
  if (world.rank() == 0) {
    for (const auto& entry : mine)
      names += entry.first + "\n";
  }
  int64_t length = static_cast<int64_t>(names.size());
  world.broadcast(&length, sizeof length, 0);
  names.resize(static_cast<size_t>(length));
  if (length > 0) world.broadcast(names.data(), length, 0);
  std::map<std::string, SimPhaseCharge> out;
  std::istringstream lines(names);
  for (std::string name; std::getline(lines, name);) {
    const auto it = mine.find(name);
    double seconds[2] = {it == mine.end() ? 0.0 : it->second.kernel_s,
                         it == mine.end() ? 0.0 : it->second.data_s};
    world.all_reduce(seconds, 2, Reduction::max);
    out[name] = {seconds[0] / static_cast<double>(calls), seconds[1] / static_cast<double>(calls)};
  }
  return out;
}

// A plan's row: the simulated times beside the prediction.
cli::JsonLine row_json(const SimRow& row, const Problem& problem, int ranks, int per_node,
                       const Machine& machine, const Timings& t, const Prediction& prediction,
                       const std::map<std::string, SimPhaseCharge>& charges, int64_t peak_bytes,
                       double wall_s, bool backward) {
  cli::JsonLine line;
  // Every row says what it is: fwd_ms, bwd_ms and ms.* are simulated times (SimGrid's clock on
  // the simulated device), not measurements, whatever keys a2d run's rows share with it.
  line.add("simulated", true);
  cli::add_plan_fields(line, row.plan);
  line.add("spec", row.spec).add("ranks", ranks).add("gpus_per_node", per_node);
  cli::add_problem_fields(line, problem);
  line.add("dtype", dtype_name(problem.dtype)).add("machine", machine.name);
  line.add("planner_rank", row.planner_rank);
  if (!row.skipped.empty()) return line.add("skipped", row.skipped);
  const double flops = forward_flops(problem);
  add_timing_fields(line, "fwd", t.forward, flops, ranks);
  if (backward) add_timing_fields(line, "bwd", t.backward, 2.5 * flops, ranks);
  line.add("pred_fwd_ms", 1e3 * prediction.forward_s);
  if (backward) line.add("pred_bwd_ms", 1e3 * prediction.backward_s);
  line.add("pred_bytes_fwd", prediction.forward.bytes)
      .add("pred_bytes_bwd", prediction.backward.bytes)
      .add("peak_device_bytes", peak_bytes)
      .add("model_mem_bytes", prediction.memory_bytes)
      .add("wall_s", wall_s);
  for (const auto& [name, ms] : t.phase_ms)
    line.add("ms." + name, ms);
  // The device's own share of each phase (the slowest rank's): kernels, and data operations.
  for (const auto& [name, charge] : charges) {
    if (charge.kernel_s > 0) line.add("dev_kernel_ms." + name, 1e3 * charge.kernel_s);
    if (charge.data_s > 0) line.add("dev_data_ms." + name, 1e3 * charge.data_s);
  }
  for (const PhaseCost& phase : prediction.phases)
    line.add("pred_ms." + phase.name, 1e3 * phase.seconds);
  line.add("pred_ms.forward.kernel", 1e3 * prediction.forward_compute_s);
  if (backward) line.add("pred_ms.backward.kernel", 1e3 * prediction.backward_compute_s);
  return line;
}

// As run_collectively, without the signal handling and watchdog threads (SimGrid runs every rank
// as a thread of one process): a CollectiveError is printed once and gives 2, any other error
// aborts the simulated job (3).
int run_simulated(Communicator& world, const std::function<int()>& body) {
  try {
    return body();
  } catch (const CollectiveError& e) {
    if (world.rank() == 0) std::cerr << "a2d sim: " << e.brief() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "a2d sim (rank " << world.rank() << "): " << error_text(e)
              << "\na2d sim: aborting the simulated job\n";
    MPI_Abort(MPI_COMM_WORLD, 3);
    return 3;
  }
}

}  // namespace

int sim(int argc, char** argv, int first) {
  MpiSession mpi(&argc, &argv);
  auto log = std::make_shared<TrafficLog>();
  CountingCommunicator world(make_mpi_communicator(MPI_COMM_WORLD), log);
  return run_simulated(world, [&]() -> int {
    SimOptions o;
    cli::Options options(kSimUsage, kSimAbout);
    declare_sim_options(options, o);
    bool asked_help = false;
    Problem problem;
    Machine machine;
    int per_node = 1;
    SimDevice device;
    std::vector<SimRow> rows;
    const int ranks = world.size();
    collective_check(world, [&] {
      asked_help = !options.parse(argc, argv, first);
      if (asked_help) return;
      A2D_REQUIRE(o.warmup >= 0 && o.iters >= 1, "--warmup must be >= 0 and --iters >= 1");
      A2D_REQUIRE(o.pool_gib >= 1, "--pool-gib must be at least 1");
      A2D_REQUIRE(!options.given("--gpus-per-node") || o.machine_file.empty(), "--gpus-per-node ",
                  o.gpus_per_node, " and --machine-file ", o.machine_file,
                  " contradict each other: the file's ranks_per_node places the ranks on nodes; "
                  "give one of them");
      problem = o.problem.problem(DType::bf16);  // the simulated device is a GPU
      const bool from_file = !o.machine_file.empty();
      machine = MachineChoice{from_file ? "" : o.machine, "", o.machine_file}.machine(
          ranks, problem.dtype);
      // The platform's nodes (sim/make_platforms.py writes its GPUs per node into it) are the
      // model's by default, and must be where given: the platform's links are then those of the
      // machine the prediction beside the simulation assumes.
      const int platform = platform_gpus_per_node();
      per_node = machine.ranks_per_node > 0            ? machine.ranks_per_node
                 : options.given("--gpus-per-node") || platform == 0
                     ? static_cast<int>(o.gpus_per_node)
                     : platform;
      A2D_REQUIRE(platform == 0 || platform == per_node,
                  machine.ranks_per_node > 0
                      ? "the machine file's ranks_per_node " + std::to_string(per_node)
                      : "--gpus-per-node " + std::to_string(per_node),
                  " does not match the platform, whose nodes have ",
                  cli::count_of(platform, "GPU"), " each (its property gpus_per_node): give ",
                  machine.ranks_per_node > 0 ? "a machine file" : "--gpus-per-node",
                  " of the platform's nodes, or a platform (sim/platforms/) whose nodes have ",
                  per_node);
      A2D_REQUIRE(per_node >= 1 && per_node <= ranks && ranks % per_node == 0, "--gpus-per-node ",
                  per_node, " must divide the ", ranks, " ranks");
      device.machine = machine;
      device.memory_bytes_per_s = 1e9 * (o.memory_gbs >= 0 ? o.memory_gbs
                                         : from_file       ? 0
                                                           : preset_memory_gbs(o.machine));
      device.cuda_rules = !from_file || o.cuda_rules;  // a preset is a GPU
      device.pool_bytes = o.pool_gib << 30;
      set_simulated_host_reduction(1e9 * o.host_reduction_gbs);
    });
    if (asked_help) return 0;
    collective_check(world, [&] {
      if (world.rank() != 0) return;
      const PlanSearch search = search_plans(problem, ranks, machine, per_node, o.backward);
      for (const std::string& spec : split(o.plans, ',')) {
        SimRow row;
        row.spec = spec;
        row.plan = parse_plan(spec, problem, ranks, search, &row.skipped);
        if (row.skipped.empty()) {
          try {
            check_plan(row.plan, problem, ranks);
          } catch (const Error& e) {
            row.skipped = e.message();
          }
        }
        rows.push_back(row);
      }
      for (int64_t i = 0; i < o.top && i < static_cast<int64_t>(search.ranked.size()); ++i) {
        SimRow row;
        row.plan = search.ranked[static_cast<size_t>(i)].plan;
        row.spec = "top" + std::to_string(i + 1);
        rows.push_back(row);
      }
      for (SimRow& row : rows) {
        for (size_t i = 0; i < search.ranked.size(); ++i) {
          if (same_plan(search.ranked[i].plan, row.plan)) {
            row.planner_rank = static_cast<int>(i) + 1;
            break;
          }
        }
      }
    });
    broadcast_rows(world, rows);
    std::unique_ptr<SimBackend> backend;
    collective_check(world, [&] {
      // What the GPU's kernels refuse, before the table starts, in the planner's words (a2d sim
      // has no --device to advise).
      if (device.cuda_rules) check_machine_runs(machine, problem);
      backend = make_sim_backend(device, smpi_runtime());
    });
    backend->attribute_to(world.shared_phase());
    if (world.rank() == 0 && !o.json) {
      std::printf("a2d sim: %s on %d simulated ranks (%d per node), device %s\n",
                  problem.describe().c_str(), ranks, per_node, machine.name.c_str());
      std::printf("%-22s %-14s %12s %12s %12s %12s %8s %9s\n", "algorithm", "plan", "sim fwd ms",
                  "pred fwd ms", "sim bwd ms", "pred bwd ms", "rank", "wall s");
    }
    std::vector<const SimRow*> done;
    for (const SimRow& row : rows) {
      bool repeated = false;
      for (const SimRow* earlier : done)
        repeated = repeated || (row.skipped.empty() && same_plan(earlier->plan, row.plan));
      done.push_back(&row);
      Timings timings;
      Prediction prediction;
      int64_t peak = 0;
      std::map<std::string, SimPhaseCharge> charges;
      const auto start = std::chrono::steady_clock::now();
      if (row.skipped.empty() && !repeated) {
        std::unique_ptr<DistributedAttention> attention;
        collective_check(world,
                         [&] { attention = make_attention(problem, row.plan, world, *backend); });
        ShardSet shards =
            make_device_shards(problem, attention->layout(), world.rank(), o.backward, *backend);
        backend->reset_charges();
        timings =
            time_attention(world, *log, *attention, problem, shards, o.backward, o.warmup, o.iters);
        peak = backend->charges().peak_bytes;
        world.set_phase("control");
        world.all_reduce(&peak, 1, Reduction::max);
        charges = slowest_charges(world, backend->charges().by_phase, o.warmup + o.iters);
        if (world.rank() == 0) prediction = predict(problem, row.plan, machine, per_node);
      }
      const double wall =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (world.rank() != 0 || repeated) continue;
      if (o.json) {
        std::cout << row_json(row, problem, ranks, per_node, machine, timings, prediction, charges,
                              peak, wall, o.backward)
                         .str()
                  << std::endl;
        continue;
      }
      const std::string shape = plan_shape(row.plan, " nt");
      if (!row.skipped.empty()) {
        std::printf("%-22s %-14s skipped: %s\n", algorithm_name(row.plan.algorithm).c_str(),
                    shape.c_str(), row.skipped.c_str());
        continue;
      }
      std::printf("%-22s %-14s %12.3f %12.3f %12.3f %12.3f %8d %9.1f\n",
                  algorithm_name(row.plan.algorithm).c_str(), shape.c_str(),
                  timings.forward.median_ms, 1e3 * prediction.forward_s,
                  o.backward ? timings.backward.median_ms : 0.0,
                  o.backward ? 1e3 * prediction.backward_s : 0.0, row.planner_rank, wall);
      std::fflush(stdout);
    }
    return 0;
  });
}

}  // namespace a2d::commands
