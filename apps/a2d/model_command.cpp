// a2d model and a2d plan: the cost model from the command line (no MPI, no data).
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <vector>

#include "attention2d/cost_model.hpp"
#include "attention2d/decomposition.hpp"
#include "attention2d/error.hpp"
#include "attention2d/planner.hpp"
#include "attention2d/tools/cli.hpp"
#include "commands.hpp"
#include "problem_options.hpp"

namespace a2d::commands {
namespace {

struct ModelOptions {
  cli::ProblemOptions problem;
  cli::ShardOptions shards;
  std::string machine = "h100-ndr";
  std::string calibration;  // "" = default_calibration_file()
  std::string machine_file;
  std::string plot;
  std::string plot_x = "gpus";
  int64_t gpus = 16;
  int64_t gpus_per_node = 8;
  bool json = false;
  bool forward_only = false;
  bool balance = false;

  void declare(cli::Options& options) {
    problem.dtype = "bf16";  // the GPUs' precision
    problem.declare(options);
    shards.declare(options, true);
    options.add_string("--machine", &machine, "a100-hdr, h100-ndr or local (from a2d calibrate)");
    options.add_string("--calibration", &calibration,
                       "calibration file of --machine local (default $A2D_CALIBRATION or "
                       "./a2d-calibration.txt)");
    options.add_string(
        "--machine-file", &machine_file,
        "a machine description file (links, ranks per node and whether they share\n"
        "a link, kernel rates; scripts/cluster.sh writes one): instead of --machine,\n"
        "and its ranks_per_node instead of --gpus-per-node");
    options.add_int("--gpus", &gpus, "ranks P (GPUs, or processes on this machine)");
    options.add_int("--gpus-per-node", &gpus_per_node,
                    "ranks per node (consecutive ranks share one)");
    options.add_flag("--forward-only", &forward_only, "rank by the forward time alone");
    options.add_flag("--json", &json, "one JSON object per line");
    options.add_flag("--balance", &balance,
                     "instead of the times: for every algorithm, grid and layout, the busiest "
                     "rank's forward FLOPs and kernel tiles (the CPU kernels' tile replay) over "
                     "the mean rank's");
  }

  MachineChoice machine_choice() const {
    return {machine, calibration.empty() ? default_calibration_file() : calibration, machine_file};
  }
};

std::string grid_text(const Plan& plan, bool cyclic_placement) {
  return plan_shape(plan, " no-transpose") + (cyclic_placement ? " cyclic" : "");
}

void print_table(const PlanSearch& search, const Problem& problem, const Machine& machine,
                 int ranks, int per_node, const UserShards* shards) {
  std::printf("a2d model: %s\nmachine: %s (%s)\n%d ranks, %d per node\n",
              problem.describe().c_str(), machine.name.c_str(), machine.description.c_str(), ranks,
              per_node);
  if (shards) {
    std::printf("shards: %s, exchanged into each plan's layout and back (%s backward)\n",
                shards->layout.describe().c_str(),
                relayout_backward_name(shards->backward).c_str());
  }
  std::printf("\n%-4s %-20s %-23s %10s %10s %10s %14s %14s %9s %12s%s\n", "#", "algorithm",
              "grid/layout", "fwd ms", "bwd ms", "total ms", "words fwd", "words bwd", "messages",
              "memory MiB", shards ? "  relayout ms" : "");
  int index = 1;
  for (const RankedPlan& r : search.ranked) {
    const Prediction& p = r.prediction;
    std::printf("%-4d %-20s %-23s %10.3f %10.3f %10.3f %14.4g %14.4g %9lld %12.1f", index++,
                algorithm_name(r.plan.algorithm).c_str(),
                grid_text(r.plan, r.cyclic_placement).c_str(), 1e3 * p.forward_s,
                1e3 * p.backward_s, 1e3 * (p.forward_s + p.backward_s), p.words_forward,
                p.words_backward, static_cast<long long>(p.forward.messages + p.backward.messages),
                p.memory_bytes / 1048576.0);
    if (shards) std::printf(" %12.3f", 1e3 * (p.relayout_forward_s + p.relayout_backward_s));
    std::printf("\n");
  }
  for (const auto& [algorithm, reason] : search.skipped) {
    std::printf("skipped %s: %s\n", algorithm.c_str(), reason.c_str());
  }
  std::printf(
      "\nwords: elements the busiest rank sends; messages: forward + backward; "
      "memory: peak per rank%s\n",
      shards ? "; relayout: the exchanges' part of fwd + bwd (included)" : "");
}

std::string json_row(const RankedPlan& r, int rank_in_list, int ranks) {
  const Prediction& p = r.prediction;
  cli::JsonLine line;
  line.add("rank", rank_in_list);
  cli::add_plan_fields(line, r.plan);
  line.add("placement", r.cyclic_placement ? "cyclic" : "block")
      .add("ranks", ranks)
      .add("fwd_ms", 1e3 * p.forward_s)
      .add("bwd_ms", 1e3 * p.backward_s)
      .add("fwd_compute_ms", 1e3 * p.forward_compute_s)
      .add("bwd_compute_ms", 1e3 * p.backward_compute_s)
      .add("words_per_rank", p.words_forward + p.words_backward)
      .add("words_fwd", p.words_forward)
      .add("words_bwd", p.words_backward)
      .add("bytes_fwd", p.forward.bytes)
      .add("bytes_bwd", p.backward.bytes)
      .add("messages", p.forward.messages + p.backward.messages)
      .add("memory_bytes", p.memory_bytes)
      .add("relayout_bytes_fwd", p.relayout_forward.bytes)
      .add("relayout_bytes_bwd", p.relayout_backward.bytes)
      .add("relayout_fwd_ms", 1e3 * p.relayout_forward_s)
      .add("relayout_bwd_ms", 1e3 * p.relayout_backward_s);
  return line.str();
}

// The best plan of each algorithm family, for the plot's curves.
std::map<std::string, double> best_per_algorithm(const PlanSearch& search, bool forward_only) {
  std::map<std::string, double> best;
  for (const RankedPlan& r : search.ranked) {
    const std::string name = algorithm_name(r.plan.algorithm);
    const double total = r.prediction.forward_s + (forward_only ? 0 : r.prediction.backward_s);
    if (!best.count(name) || total < best[name]) best[name] = total;
  }
  return best;
}

void plot(const ModelOptions& o, const Problem& base) {
  const MachineChoice choice = o.machine_choice();
  const bool over_gpus = o.plot_x == "gpus";
  A2D_REQUIRE(over_gpus || o.plot_x == "seq", "--plot-x is gpus or seq, got '", o.plot_x, "'");
  std::vector<int64_t> xs;
  if (over_gpus) {
    for (int64_t p = 2; p <= std::max<int64_t>(o.gpus, 64); p *= 2)
      xs.push_back(p);
  } else {
    for (int64_t n = std::max<int64_t>(base.seq / 16, 1024); n <= base.seq * 16; n *= 2)
      xs.push_back(n);
  }
  std::vector<std::string> names = {"attention2d", "attention2d-overlap", "ring", "allgather-kv",
                                    "ulysses"};
  std::ostringstream data;
  for (const int64_t x : xs) {
    Problem problem = base;
    int ranks = static_cast<int>(o.gpus);
    if (over_gpus)
      ranks = static_cast<int>(x);
    else
      problem.seq = x;
    const Machine machine = choice.machine(ranks, problem.dtype);
    const std::optional<UserShards> shards = o.shards.user_shards(problem.seq, ranks);
    const auto best = best_per_algorithm(
        search_plans(problem, ranks, machine,
                     model_ranks_per_node(machine, static_cast<int>(o.gpus_per_node), ranks),
                     !o.forward_only, false, shards ? &*shards : nullptr),
        o.forward_only);
    data << x;
    for (const std::string& name : names) {
      const auto it = best.find(name);
      data << " "
           << (it == best.end() ? std::string("NaN") : cli::format_double(1e3 * it->second, 6));
    }
    data << "\n";
  }
  const bool svg = o.plot.size() > 4 && o.plot.substr(o.plot.size() - 4) == ".svg";
  const bool png = o.plot.size() > 4 && o.plot.substr(o.plot.size() - 4) == ".png";
  A2D_REQUIRE(svg || png, "--plot needs a .svg or .png file name, got '", o.plot, "'");
  std::ostringstream script;
  script << "set terminal " << (svg ? "svg size 900,560 dynamic" : "pngcairo size 900,560") << "\n"
         << "set output '" << o.plot << "'\n"
         << "set title 'Predicted " << (o.forward_only ? "forward" : "forward + backward")
         << " time, " << choice.name << " (" << dtype_name(base.dtype) << "), N=" << base.seq
         << " H=" << base.heads << " D=" << base.head_dim
         << (base.mask.is_causal() ? " causal" : "") << "' noenhanced\n"
         << "set xlabel '" << (over_gpus ? "ranks P" : "sequence length N") << "'\n"
         << "set ylabel 'time per layer (ms)'\nset logscale xy 2\nset grid\nset key left top\n"
         << "$data << EOD\n"
         << data.str() << "EOD\nplot";
  for (size_t i = 0; i < names.size(); ++i) {
    script << (i ? "," : "") << " $data using 1:" << i + 2 << " with linespoints title '"
           << names[i] << "'";
  }
  script << "\n";
  FILE* gnuplot = ::popen("gnuplot", "w");
  A2D_REQUIRE(gnuplot, "cannot start gnuplot (scripts/setup.sh installs gnuplot-nox)");
  std::fputs(script.str().c_str(), gnuplot);
  const int status = ::pclose(gnuplot);
  A2D_REQUIRE(status == 0, "gnuplot failed (exit status ", WEXITSTATUS(status), ") writing ",
              o.plot);
  std::cerr << "a2d model: wrote " << o.plot << "\n";
}

// Every algorithm, ATTENTION2D grid and baseline layout that can run the problem on `ranks`.
std::vector<Plan> balance_plans(const Problem& problem, int ranks) {
  PlanChoices choices;
  choices.layouts = {LayoutKind::contiguous, LayoutKind::zigzag, LayoutKind::striped,
                     LayoutKind::cyclic};
  std::vector<Plan> plans;
  for (const Algorithm algorithm : all_algorithms()) {
    for (const Plan& plan : algorithm_plans(algorithm, problem, ranks, choices))
      plans.push_back(plan);
  }
  std::vector<Plan> allowed;
  for (const Plan& plan : plans) {
    try {
      check_plan(plan, problem, ranks);
      allowed.push_back(plan);
    } catch (const Error&) {
      // not a plan this problem allows (a layout the algorithm refuses, heads P does not divide)
    }
  }
  return allowed;
}

void print_balance(const Problem& problem, int ranks, bool json) {
  if (!json) {
    std::printf("a2d model --balance: %s on %d ranks\n%-20s %-16s %12s %12s %12s\n",
                problem.describe().c_str(), ranks, "algorithm", "grid/layout", "flops max/avg",
                "tiles fwd", "tiles bwd");
  }
  for (const Plan& plan : balance_plans(problem, ranks)) {
    const double flops = flops_balance(problem, plan);
    const TileBalance tiles = tile_balance(problem, plan);
    if (json) {
      std::cout << cli::JsonLine()
                       .add("algo", algorithm_name(plan.algorithm))
                       .add("grid", plan.grid.describe())
                       .add("heads_parallel", plan.heads_parallel)
                       .add("layout", layout_name(plan.layout))
                       .add("ranks", ranks)
                       .add("documents", problem.mask.documents())
                       .add("balance_flops", flops)
                       .add("balance_tiles_fwd", tiles.forward_ratio())
                       .add("balance_tiles_bwd", tiles.backward_ratio())
                       .str()
                << "\n";
      continue;
    }
    std::printf("%-20s %-16s %12.4f %12.4f %12.4f\n", algorithm_name(plan.algorithm).c_str(),
                grid_text(plan, false).c_str(), flops, tiles.forward_ratio(),
                tiles.backward_ratio());
  }
  if (!json) {
    std::printf(
        "\nflops max/avg: the busiest rank's forward FLOPs (visible pairs) over the mean rank's; "
        "tiles: the same for the kernel tiles the CPU kernels compute (partial tiles whole), "
        "-1 where the replay would take too long; 1 = perfect balance\n");
  }
}

}  // namespace

int model(int argc, char** argv, int first) {
  if (has_flag(argc, argv, first, "--decode")) return model_decode(argc, argv, first);
  ModelOptions o;
  cli::Options options(
      "a2d model [options]",
      "Predicts, for every algorithm and every grid shape of P, the forward and backward time,\n"
      "the words and messages each rank sends and the peak memory per rank, best first. Pure\n"
      "arithmetic: instant for P up to 16384 and N up to 2^24. docs/cost-model.md derives it.");
  o.declare(options);
  bool decode = false;  // handled by model_decode (decode_model_command.cpp)
  options.add_flag("--decode", &decode,
                   "instead: prefill and decode steps (a2d model --decode --help)");
  options.add_string("--plot", &o.plot, "also draw predicted time against --plot-x (.svg or .png)");
  options.add_string("--plot-x", &o.plot_x,
                     "gpus (powers of two up to --gpus) or seq (N/16 .. 16N)");
  if (!options.parse(argc, argv, first)) return 0;
  const Problem problem = o.problem.problem();
  A2D_REQUIRE(o.gpus >= 1 && o.gpus <= (1 << 20), "--gpus must be between 1 and 2^20");
  A2D_REQUIRE(o.gpus_per_node >= 1, "--gpus-per-node must be at least 1");
  const MachineChoice choice = o.machine_choice();
  const int ranks = static_cast<int>(o.gpus);
  if (o.balance) {
    print_balance(problem, ranks, o.json);
    return 0;
  }
  const Machine machine = choice.machine(ranks, problem.dtype);
  const int per_node = model_ranks_per_node(
      machine, static_cast<int>(std::min<int64_t>(o.gpus_per_node, ranks)), ranks);
  const std::optional<UserShards> shards = o.shards.user_shards(problem.seq, ranks);
  const UserShards* user = shards ? &*shards : nullptr;
  const PlanSearch search = search_plans(problem, ranks, machine, per_node, !o.forward_only,
                                         machine.ranks_per_node > 0, user);
  if (o.json) {
    int index = 1;
    for (const RankedPlan& r : search.ranked)
      std::cout << json_row(r, index++, ranks) << "\n";
    for (const auto& [algorithm, reason] : search.skipped) {
      std::cout << cli::JsonLine().add("algo", algorithm).add("skipped", reason).str() << "\n";
    }
  } else {
    print_table(search, problem, machine, ranks, per_node, user);
  }
  if (!o.plot.empty()) plot(o, problem);
  return 0;
}

int plan(int argc, char** argv, int first) {
  ModelOptions o;
  o.machine = "";
  cli::Options options(
      "a2d plan [options]",
      "Names the fastest algorithm and grid for a run, by the cost model. Without\n"
      "--machine: this machine's calibration if there is one (a2d calibrate).");
  o.declare(options);
  if (!options.parse(argc, argv, first)) return 0;
  const Problem problem = o.problem.problem();
  const int ranks = static_cast<int>(o.gpus);
  const int per_node =
      model_ranks_per_node(o.machine_choice().machine(ranks, problem.dtype),
                           static_cast<int>(std::min<int64_t>(o.gpus_per_node, ranks)), ranks);
  const std::optional<UserShards> shards = o.shards.user_shards(problem.seq, ranks);
  const PlannedRun planned = choose_plan(problem, ranks, per_node, o.machine_choice(), "", "", 0,
                                         shards ? &*shards : nullptr);
  if (o.json) {
    std::cout << json_row({planned.plan, planned.prediction, planned.cyclic_placement}, 1, ranks)
              << "\n";
    return 0;
  }
  std::printf("%s\nplan: %s\npredicted: forward %.3f ms, backward %.3f ms on %s\n",
              problem.describe().c_str(), planned.plan.describe().c_str(),
              1e3 * planned.prediction.forward_s, 1e3 * planned.prediction.backward_s,
              planned.machine_description.c_str());
  if (shards && same_assignment(shards->layout, plan_layout(problem, planned.plan))) {
    std::printf("shards: %s, the plan's own layout: nothing to exchange\n",
                shards->layout.describe().c_str());
  } else if (shards) {
    const Prediction& p = planned.prediction;
    std::printf(
        "shards: %s into the plan's %s and back: forward %.3f ms (%lld bytes/rank), "
        "backward %.3f ms (%lld bytes/rank, %s), included above\n",
        shards->layout.describe().c_str(), plan_layout(problem, planned.plan).describe().c_str(),
        1e3 * p.relayout_forward_s, static_cast<long long>(p.relayout_forward.bytes),
        1e3 * p.relayout_backward_s, static_cast<long long>(p.relayout_backward.bytes),
        relayout_backward_name(shards->backward).c_str());
  }
  if (planned.cyclic_placement)
    std::printf("placement: world rank q on node q mod %d (mpirun --map-by node)\n",
                (ranks + per_node - 1) / per_node);
  std::printf("run it: mpirun -np %d%s a2d run --algo %s", ranks,
              planned.cyclic_placement ? " --map-by node" : "",
              algorithm_name(planned.plan.algorithm).c_str());
  std::printf("%s", plan_options(planned.plan).c_str());
  if (!o.shards.kind.empty()) std::printf(" --shards %s", o.shards.kind.c_str());
  if (!o.shards.counts.empty()) std::printf(" --shard-counts %s", o.shards.counts.c_str());
  if (o.shards.stripe != 1)
    std::printf(" --shard-stripe %lld", static_cast<long long>(o.shards.stripe));
  std::printf(" ...\n");
  return 0;
}

}  // namespace a2d::commands
