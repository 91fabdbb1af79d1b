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
  cli::MachineOptions machine;
  std::string plot;
  std::string plot_x = "gpus";
  int64_t gpus = 16;
  int64_t gpus_per_node = 8;
  int64_t top = 0;
  bool json = false;
  bool forward_only = false;
  bool balance = false;

  // model: also --forward-only, --balance and --top (a2d plan ranks by forward + backward and
  // prints its plan's reasons).
  void declare(cli::Options& options, bool model) {
    problem.dtype_by_machine = true;
    problem.declare(options);
    shards.declare(options, true);
    machine.declare(options, true, true, true);
    options.add_int("--gpus", &gpus, "ranks P (GPUs, or processes on this machine)");
    options.add_int("--gpus-per-node", &gpus_per_node,
                    "ranks per node (consecutive ranks share one); P must be a multiple where it "
                    "is larger");
    options.add_flag("--json", &json, "one JSON object per line");
    if (!model) return;
    options.add_flag("--forward-only", &forward_only, "rank by the forward time alone");
    options.add_int("--top", &top, "print the K best plans only (0: every plan)");
    options.add_flag("--balance", &balance,
                     "instead of the times: for every algorithm, grid and layout, the busiest "
                     "rank's forward FLOPs and kernel tiles (the CPU kernels' tile replay) over "
                     "the mean rank's");
  }

  // A machine file places the ranks on nodes itself (its ranks_per_node, which it must have):
  // --gpus-per-node beside it would be ignored, so it is refused.
  void refuse_per_node_beside_file(const cli::Options& options) const {
    A2D_REQUIRE(!options.given("--gpus-per-node") || machine.file.empty(), "--gpus-per-node ",
                gpus_per_node, " and --machine-file ", machine.file,
                " contradict each other: the file's ranks_per_node places the ranks on nodes; "
                "give one of them");
  }

  int ranks() const {
    A2D_REQUIRE(gpus >= 1 && gpus <= (1 << 20), "--gpus must be between 1 and 2^20, got ", gpus);
    A2D_REQUIRE(gpus_per_node >= 1, "--gpus-per-node must be at least 1, got ", gpus_per_node);
    return static_cast<int>(gpus);
  }
};

// Which placement of ranks on nodes a plan was predicted with, in the words of docs/cost-model.md
// ("Links"): block (consecutive ranks share a node) or round-robin (rank q on node q mod nodes,
// mpirun --map-by node); not a token layout.
const char* placement_name(bool cyclic_placement) {
  return cyclic_placement ? "round-robin" : "block";
}

double total_s(const Prediction& p, bool forward_only = false) {
  return p.forward_s + (forward_only ? 0.0 : p.backward_s);
}

// The fastest Ring Attention plan of the search (fitting or not): the paper's baseline.
const RankedPlan* best_ring(const PlanSearch& search, bool forward_only) {
  const RankedPlan* best = nullptr;
  for (const auto* list : {&search.ranked, &search.excluded}) {
    for (const RankedPlan& r : *list) {
      if (r.plan.algorithm != Algorithm::ring) continue;
      if (!best || total_s(r.prediction, forward_only) < total_s(best->prediction, forward_only))
        best = &r;
    }
  }
  return best;
}

std::string times_ring(const Prediction& p, const RankedPlan* ring, bool forward_only) {
  if (!ring) return "-";
  char text[32];
  std::snprintf(text, sizeof text, "%.2f",
                total_s(ring->prediction, forward_only) / total_s(p, forward_only));
  return text;
}

void print_table(const PlanSearch& search, const Problem& problem, const Machine& machine,
                 int ranks, int per_node, const UserShards* shards, bool placements,
                 bool forward_only, int64_t top) {
  std::printf("a2d model: %s\nmachine: %s (%s)\n%s, %d per node; memory per rank: %s\n",
              problem.describe().c_str(), machine.name.c_str(), machine.description.c_str(),
              cli::count_of(ranks, "rank").c_str(), per_node,
              search.memory_cap > 0
                  ? ("at most " + format_bytes(static_cast<double>(search.memory_cap))).c_str()
                  : "no cap");
  if (shards) {
    std::printf("shards: %s, exchanged into each plan's layout and back (%s backward)\n",
                shards->layout.describe().c_str(),
                relayout_backward_name(shards->backward).c_str());
  }
  try {
    check_machine_runs(machine, problem);
  } catch (const Error& e) {
    std::printf("note: %s; the predictions below are for kernels that would run it at the "
                "machine's rates\n",
                e.message().c_str());
  }
  const RankedPlan* ring = best_ring(search, forward_only);
  const auto header = [&] {
    std::printf("\n%-4s %-20s %-17s%s %10s %10s %10s %12s %12s %9s %12s %7s%s\n", "#", "algorithm",
                "grid/layout", placements ? " placement  " : "", "fwd ms", "bwd ms", "total ms",
                "words fwd", "words bwd", "messages", "memory MiB", "x Ring",
                shards ? "  relayout ms" : "");
  };
  const auto row = [&](const RankedPlan& r, const std::string& index) {
    const Prediction& p = r.prediction;
    std::printf("%-4s %-20s %-17s", index.c_str(), algorithm_name(r.plan.algorithm).c_str(),
                plan_shape(r.plan, " no-transpose").c_str());
    if (placements) std::printf(" %-11s", placement_name(r.cyclic_placement));
    std::printf(" %10.3f %10.3f %10.3f %12.4g %12.4g %9lld %12.1f %7s", 1e3 * p.forward_s,
                1e3 * p.backward_s, 1e3 * (p.forward_s + p.backward_s), p.words_forward,
                p.words_backward, static_cast<long long>(p.forward.messages + p.backward.messages),
                static_cast<double>(p.memory_bytes) / 1048576.0,
                times_ring(p, ring, forward_only).c_str());
    if (shards) std::printf(" %12.3f", 1e3 * (p.relayout_forward_s + p.relayout_backward_s));
    std::printf("\n");
  };
  header();
  const size_t shown = top > 0 ? std::min<size_t>(static_cast<size_t>(top), search.ranked.size())
                               : search.ranked.size();
  for (size_t i = 0; i < shown; ++i)
    row(search.ranked[i], std::to_string(i + 1));
  if (shown < search.ranked.size())
    std::printf("... %zu more plans that fit (--top 0 prints every one)\n",
                search.ranked.size() - shown);
  if (search.ranked.empty()) std::printf("(none fits)\n");
  if (!search.excluded.empty()) {
    std::printf("\n%zu %s more than %s per rank (excluded):\n", search.excluded.size(),
                search.excluded.size() == 1 ? "plan needs" : "plans need",
                format_bytes(static_cast<double>(search.memory_cap)).c_str());
    const size_t excluded_shown =
        top > 0 ? std::min<size_t>(static_cast<size_t>(top), search.excluded.size())
                : search.excluded.size();
    for (size_t i = 0; i < excluded_shown; ++i)
      row(search.excluded[i], "-");
    if (excluded_shown < search.excluded.size())
      std::printf("... %zu more\n", search.excluded.size() - excluded_shown);
  }
  for (const auto& [algorithm, reason] : search.skipped) {
    std::printf("skipped %s: %s\n", algorithm.c_str(), reason.c_str());
  }
  std::printf(
      "\n%s\n",
      cli::wrap(std::string("best first by ") + (forward_only ? "forward" : "forward + backward") +
                " time (within " + cli::format_double(100 * kPlanTieTolerance, 3) +
                " %: less memory, then fewer bytes, first); words: elements the busiest rank "
                "sends; messages: forward + backward; memory: peak per rank; x Ring: the "
                "fastest Ring Attention plan's time over this plan's" +
                (placements ? "; placement of ranks on nodes: block (consecutive ranks share a "
                              "node) or round-robin (mpirun --map-by node)"
                            : "") +
                (shards ? "; relayout: the exchanges' part of fwd + bwd (included)" : ""))
          .c_str());
}

std::string json_row(const RankedPlan& r, int rank_in_list, int ranks, bool fits,
                     const RankedPlan* ring, double balance = -1) {
  const Prediction& p = r.prediction;
  cli::JsonLine line;
  line.add("rank", rank_in_list);
  cli::add_plan_fields(line, r.plan);
  line.add("placement", placement_name(r.cyclic_placement))
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
      .add("relayout_bwd_ms", 1e3 * p.relayout_backward_s)
      .add("fits", fits)
      .add("x_ring", ring ? total_s(ring->prediction) / total_s(p) : NAN);
  if (balance >= 0) line.add("balance_flops", balance);
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

// One machine along the whole x axis: the default (local where calibrated, else the preset)
// resolved once, at --gpus.
MachineChoice plot_machine(const ModelOptions& o) {
  MachineChoice choice = o.machine.choice();
  if (choice.name.empty() && choice.machine_file.empty()) {
    choice.name = has_calibration(choice.calibration_file, static_cast<int>(o.gpus))
                      ? "local"
                      : kDefaultMachine;
  }
  return choice;
}

void plot(const ModelOptions& o, const Problem& base) {
  const MachineChoice choice = plot_machine(o);
  const bool over_gpus = o.plot_x == "gpus";
  std::vector<int64_t> xs;
  if (over_gpus) {
    for (int64_t p = 2; p <= std::max<int64_t>(o.gpus, 64); p *= 2)
      xs.push_back(p);
  } else {
    for (int64_t n = std::max<int64_t>(base.seq / 16, 1024); n <= base.seq * 16; n *= 2)
      xs.push_back(n);
  }
  // A curve per algorithm of the table (src/table/), each its best plan that fits.
  const std::vector<std::string> names = algorithm_names();
  std::string machine_name;
  std::ostringstream data;
  for (const int64_t x : xs) {
    Problem problem = base;
    int ranks = static_cast<int>(o.gpus);
    if (over_gpus)
      ranks = static_cast<int>(x);
    else
      problem.seq = x;
    const Machine machine = choice.machine(ranks, problem.dtype);
    machine_name = machine.name;
    const std::optional<UserShards> shards = o.shards.user_shards(problem.seq, ranks);
    std::map<std::string, double> best;
    try {
      best = best_per_algorithm(
          search_plans(problem, ranks, machine,
                       model_ranks_per_node(machine, static_cast<int>(o.gpus_per_node), ranks),
                       !o.forward_only, false, shards ? &*shards : nullptr,
                       choice.memory_cap(machine)),
          o.forward_only);
    } catch (const Error&) {
      // P not a multiple of the ranks per node: no point at this x
    }
    data << x;
    for (const std::string& name : names) {
      const auto it = best.find(name);
      data << " "
           << (it == best.end() ? std::string("NaN") : cli::format_double(1e3 * it->second, 6));
    }
    data << "\n";
  }
  const bool svg = o.plot.size() > 4 && o.plot.substr(o.plot.size() - 4) == ".svg";
  std::ostringstream script;
  script << "set terminal " << (svg ? "svg size 900,560 dynamic" : "pngcairo size 900,560") << "\n"
         << "set output '" << o.plot << "'\n"
         << "set title 'Predicted " << (o.forward_only ? "forward" : "forward + backward")
         << " time, " << machine_name << " (" << dtype_name(base.dtype) << "), N=" << base.seq
         << " H=" << base.heads << " D=" << base.head_dim
         << (base.mask.hides_pairs() ? " " + base.mask.describe() : std::string())
         << "' noenhanced\n"
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
                plan_shape(plan, " no-transpose").c_str(), flops, tiles.forward_ratio(),
                tiles.backward_ratio());
  }
  if (!json) {
    std::printf(
        "\nflops max/avg: the busiest rank's forward FLOPs (visible pairs) over the mean rank's; "
        "tiles: the same for the kernel tiles the CPU kernels compute (partial tiles whole), "
        "-1 where the replay would take too long; 1 = perfect balance\n");
  }
}

// The plot's options, checked before any work: the axis, the file name and where it goes.
void check_plot_options(const ModelOptions& o) {
  if (o.plot.empty()) return;
  A2D_REQUIRE(o.plot_x == "gpus" || o.plot_x == "seq", "--plot-x is gpus or seq, got '", o.plot_x,
              "'");
  const bool svg = o.plot.size() > 4 && o.plot.substr(o.plot.size() - 4) == ".svg";
  const bool png = o.plot.size() > 4 && o.plot.substr(o.plot.size() - 4) == ".png";
  A2D_REQUIRE(svg || png, "--plot needs a .svg or .png file name, got '", o.plot, "'");
  cli::check_output_file("--plot", o.plot, true);
}

}  // namespace

int model(int argc, char** argv, int first) {
  if (has_flag(argc, argv, first, "--decode")) return model_decode(argc, argv, first);
  ModelOptions o;
  cli::Options options(
      "a2d model [options]",
      "Predicts, for every algorithm and every grid shape of P, the forward and backward time, "
      "the words and messages each rank sends and the peak memory per rank, best first; plans "
      "that need more memory per rank than the machine has (or --max-memory) are listed apart. "
      "Pure arithmetic: instant for P up to 16384 and N up to 2^24. docs/cost-model.md derives "
      "it.");
  o.declare(options, true);
  bool decode = false;  // handled by model_decode (decode_model_command.cpp)
  options.add_flag("--decode", &decode,
                   "instead: prefill and decode steps (`a2d model --decode --help`)");
  options.add_string("--plot", &o.plot,
                     "also draw the best plan of every algorithm's predicted time against "
                     "--plot-x (.svg or .png)");
  options.add_string("--plot-x", &o.plot_x,
                     "gpus (powers of two up to --gpus, at least 64) or seq (N/16 .. 16N)");
  if (!options.parse(argc, argv, first)) return 0;
  o.refuse_per_node_beside_file(options);
  const int ranks = o.ranks();
  const MachineChoice choice = o.machine.choice();
  const Problem problem = o.problem.problem(choice.default_dtype(ranks));
  A2D_REQUIRE(o.top >= 0, "--top must be >= 0 (0: every plan), got ", o.top);
  check_plot_options(o);
  if (o.balance) {
    print_balance(problem, ranks, o.json);
    return 0;
  }
  const Machine machine = choice.machine(ranks, problem.dtype);
  const int per_node = model_ranks_per_node(
      machine, static_cast<int>(std::min<int64_t>(o.gpus_per_node, ranks)), ranks);
  const std::optional<UserShards> shards = o.shards.user_shards(problem.seq, ranks);
  const UserShards* user = shards ? &*shards : nullptr;
  const bool placements = machine.ranks_per_node > 0 && per_node > 1 && per_node < ranks;
  const PlanSearch search =
      search_plans(problem, ranks, machine, per_node, !o.forward_only, machine.ranks_per_node > 0,
                   user, choice.memory_cap(machine));
  if (o.json) {
    const RankedPlan* ring = best_ring(search, false);
    int index = 1;
    for (const RankedPlan& r : search.ranked) {
      if (o.top > 0 && index > o.top) break;
      std::cout << json_row(r, index++, ranks, true, ring) << "\n";
    }
    for (const RankedPlan& r : search.excluded)
      std::cout << json_row(r, 0, ranks, false, ring) << "\n";
    for (const auto& [algorithm, reason] : search.skipped) {
      std::cout << cli::JsonLine().add("algo", algorithm).add("skipped", reason).str() << "\n";
    }
  } else {
    print_table(search, problem, machine, ranks, per_node, user, placements, o.forward_only, o.top);
  }
  if (!o.plot.empty()) plot(o, problem);
  return 0;
}

namespace {

// One row of a2d plan's reasons: where the time goes, what moves, what it holds.
void print_reason(const std::string& index, const RankedPlan& r, const RankedPlan* ring,
                  bool placements) {
  const Prediction& p = r.prediction;
  const double total = p.forward_s + p.backward_s;
  const double compute = p.forward_compute_s + p.backward_compute_s;
  const double relayout = p.relayout_forward_s + p.relayout_backward_s;
  const double exposed = std::max(0.0, total - compute - relayout);
  std::string shape = plan_shape(r.plan, " no-transpose");
  if (placements) shape += std::string(" ") + placement_name(r.cyclic_placement);
  std::printf("%-5s %-20s %-24s %11.3f %11.3f %11.3f %10.3f %11s %7lld %11s %7s\n", index.c_str(),
              algorithm_name(r.plan.algorithm).c_str(), shape.c_str(), 1e3 * total, 1e3 * compute,
              1e3 * exposed, 1e3 * relayout,
              format_bytes(static_cast<double>(p.forward.bytes + p.backward.bytes)).c_str(),
              static_cast<long long>(p.forward.messages + p.backward.messages),
              format_bytes(static_cast<double>(p.memory_bytes)).c_str(),
              times_ring(p, ring, false).c_str());
}

}  // namespace

int plan(int argc, char** argv, int first) {
  ModelOptions o;
  cli::Options options(
      "a2d plan [options]",
      "Names the fastest algorithm and grid for a run by the cost model, among the plans that "
      "fit in the memory per rank, with its reasons (where the time goes beside the next two "
      "plans and the fastest Ring Attention plan) and the command that runs it.");
  o.declare(options, false);
  if (!options.parse(argc, argv, first)) return 0;
  o.refuse_per_node_beside_file(options);
  const int ranks = o.ranks();
  const MachineChoice choice = o.machine.choice();
  const bool dtype_given = !o.problem.dtype.empty();
  const Problem problem = o.problem.problem(choice.default_dtype(ranks));
  const Machine machine = choice.machine(ranks, problem.dtype);
  check_machine_runs(machine, problem);
  const int per_node = model_ranks_per_node(
      machine, static_cast<int>(std::min<int64_t>(o.gpus_per_node, ranks)), ranks);
  const std::optional<UserShards> shards = o.shards.user_shards(problem.seq, ranks);
  const PlannedRun planned =
      choose_plan(problem, ranks, per_node, choice, "", "", 0, shards ? &*shards : nullptr);
  const RankedPlan chosen{planned.plan, planned.prediction, planned.cyclic_placement};
  const RankedPlan* ring = planned.best_ring ? &*planned.best_ring : nullptr;
  // The busiest rank's visible pairs over the mean rank's (forward FLOPs; exact, for any mask).
  const double balance = flops_balance(problem, planned.plan);
  if (o.json) {
    std::cout << json_row(chosen, 1, ranks, true, ring, balance) << "\n";
    return 0;
  }
  const int nodes = (ranks + planned.ranks_per_node - 1) / planned.ranks_per_node;
  std::printf(
      "a2d plan: %s%s\nmachine: %s\n%s, %d per node; memory per rank: %s",
      problem.describe().c_str(),
      dtype_given ? ""
                  : (machine.gpu ? " (bf16: the default on GPUs)" : " (fp32: the default on CPUs)"),
      planned.machine_description.c_str(), cli::count_of(ranks, "rank").c_str(),
      planned.ranks_per_node,
      planned.memory_cap > 0 ? ("at most " + format_bytes(static_cast<double>(planned.memory_cap)) +
                                (choice.max_memory > 0 ? " (--max-memory)" : " (the machine's)"))
                                   .c_str()
                             : "no cap");
  if (planned.excluded > 0) {
    std::printf("; %d %s more (excluded)", planned.excluded,
                planned.excluded == 1 ? "plan needs" : "plans need");
  }
  std::printf("\n\nplan: %s\n", planned.plan.describe().c_str());
  std::printf(
      "balance: its busiest rank computes %.4f times the visible pairs of the mean rank\n\n",
      balance);
  const bool placements =
      machine.ranks_per_node > 0 && planned.ranks_per_node > 1 && planned.ranks_per_node < ranks;
  std::printf("%-5s %-20s %-24s %11s %11s %11s %10s %11s %7s %11s %7s\n", "", "algorithm",
              placements ? "grid/layout placement" : "grid/layout", "total ms", "compute",
              "exposed comm", "relayout", "bytes/rank", "msgs", "memory", "x Ring");
  print_reason("plan", chosen, ring, placements);
  int index = 2;
  bool ring_shown = ring && planned.plan.describe() == ring->plan.describe() &&
                    planned.cyclic_placement == ring->cyclic_placement;
  for (const RankedPlan& r : planned.runners_up) {
    print_reason(std::to_string(index++), r, ring, placements);
    ring_shown = ring_shown || (ring && r.plan.describe() == ring->plan.describe() &&
                                r.cyclic_placement == ring->cyclic_placement);
  }
  if (ring && !ring_shown) print_reason("ring", *ring, ring, placements);
  std::printf(
      "\n%s\n",
      cli::wrap(std::string("forward + backward per layer, in ms; compute: the busiest rank's "
                            "kernels; exposed comm: the communication the kernels do not hide; "
                            "relayout: the exchanges with --shards; bytes and msgs: sent per "
                            "rank; memory: peak per rank; x Ring: the fastest Ring Attention "
                            "plan's time over this plan's") +
                (ring ? "" : " (no Ring Attention plan fits)") + ". Ties (within " +
                cli::format_double(100 * kPlanTieTolerance, 3) +
                " %) go to less memory, then fewer bytes.")
          .c_str());
  // A close call: the model is within ±35 % of measurement at best (docs/benchmarks.md), so a
  // runner-up a few percent slower is no worse by any evidence the model has.
  if (!planned.runners_up.empty()) {
    const auto total = [](const RankedPlan& r) {
      return r.prediction.forward_s + r.prediction.backward_s;
    };
    const RankedPlan& next = planned.runners_up.front();
    const double gap = total(next) / total(chosen) - 1;
    if (gap < kPlanCloseCall) {
      std::printf("%s\n",
                  cli::wrap("close call: plan 2 (" + next.plan.describe() + ") is " +
                                cli::format_double(100 * gap, 2) +
                                " % slower by the model, which is within ±35 % of measurement "
                                "at best (docs/cost-model.md): measure both (a2d bench) before "
                                "trusting the choice.",
                            100, 100, 0)
                      .c_str());
    }
  }
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
  // The command: every option the plan and the problem need, for mpirun and for Slurm.
  std::string options_text = " --algo " + algorithm_name(planned.plan.algorithm) +
                             plan_options(planned.plan) + " " +
                             o.problem.command_line(problem.dtype);
  if (!o.shards.kind.empty()) options_text += " --shards " + o.shards.kind;
  if (!o.shards.counts.empty()) options_text += " --shard-counts " + o.shards.counts;
  if (o.shards.stripe != 1) options_text += " --shard-stripe " + std::to_string(o.shards.stripe);
  options_text += " --backward";
  if (machine.gpu) options_text += " --device cuda";
  std::string mpirun = "mpirun -np " + std::to_string(ranks);
  std::string srun = "srun --mpi=pmix_v4 -n " + std::to_string(ranks);
  if (nodes > 1) {
    mpirun += planned.cyclic_placement ? " --map-by node"
                                       : " --npernode " + std::to_string(planned.ranks_per_node);
    srun += " -N " + std::to_string(nodes) +
            " --ntasks-per-node=" + std::to_string(planned.ranks_per_node) +
            " --distribution=" + (planned.cyclic_placement ? "cyclic" : "block");
  }
  std::printf("run it: %s a2d run%s\n    or: %s a2d run%s\n", mpirun.c_str(), options_text.c_str(),
              srun.c_str(), options_text.c_str());
  if (machine.gpu) {
    std::printf(
        "note: a2d's CUDA kernels and NCCL path are compiled but have not yet run on a GPU "
        "(README, status)\n");
  }
  if (planned.cyclic_placement) {
    std::printf(
        "placement: world rank q on node q mod %d (round-robin: mpirun --map-by node, "
        "srun --distribution=cyclic)\n",
        nodes);
  }
  return 0;
}

}  // namespace a2d::commands
