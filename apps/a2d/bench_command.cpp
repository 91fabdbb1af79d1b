// a2d bench: every algorithm (and every grid of ATTENTION2D) on the same seeded problem, side by
// side in one MPI job, with the cost model's prediction beside each measurement.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>
#include <vector>

#include "attention2d/collective.hpp"
#include "attention2d/cost_model.hpp"
#include "attention2d/decomposition.hpp"
#include "attention2d/error.hpp"
#include "attention2d/memory_check.hpp"
#include "attention2d/mpi_comm.hpp"
#include "attention2d/planner.hpp"
#include "attention2d/timing.hpp"
#include "attention2d/tools/check.hpp"
#include "attention2d/tools/cli.hpp"
#include "attention2d/tools/harness.hpp"
#include "attention2d/tools/progress.hpp"
#include "attention2d/watchdog.hpp"
#include "calibration.hpp"
#include "commands.hpp"
#include "memory_needs.hpp"
#include "problem_options.hpp"
#include "run_support.hpp"

namespace a2d::commands {
namespace {

struct BenchOptions {
  cli::ProblemOptions problem;
  cli::DeviceOptions device;
  cli::MachineOptions machine;  // --calibration, --machine-file: the predictions' machine
  std::string algos = algorithm_list(",");  // every algorithm of the table (src/table/)
  std::string grid, layout;
  int64_t stripe = 1, threads = 1, warmup = 1, iters = 3, seed = 42, heads_parallel = 0;
  bool no_kv_transpose = false, backward = false, check = false, json = false, csv = false;
  bool calibrate = false, no_resample_kernel = false, sequential = false, balance = false;
  bool no_memory_check = false, quiet = false;
  double timeout = kDefaultTimeout;
};

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

struct Row {
  Plan plan;
  double flops_balance = -1;  // --balance: busiest / mean rank, forward FLOPs
  TileBalance tiles;          // --balance: the tile replay's
  std::string skipped;        // reason, if the plan cannot run
  Timings timings;
  int64_t peak_bytes = -1;
  bool predicted = false;
  Prediction prediction;
  OutputErrors errors;
};

// Every plan the options ask for; plans that cannot run carry the reason.
std::vector<Row> candidate_rows(const BenchOptions& o, const Problem& problem, int ranks) {
  std::vector<Row> rows;
  for (const std::string& name : split_list(o.algos)) {
    const Algorithm algorithm = parse_algorithm(name);
    const AlgorithmTraits& traits = algorithm_traits(algorithm);
    // Grid algorithms: every grid of P, or --grid; the hybrid: every U > 1 and grid of P / U
    // (U = 1 is the attention2d rows), or those of --heads-parallel and --grid; the others:
    // their default layout, or a row per --layout (zigzag,contiguous,...).
    if (traits.heads_parallel)
      A2D_REQUIRE(o.heads_parallel >= 0, "--heads-parallel must be at least 1");
    const bool one_grid = traits.grid && !o.grid.empty();
    const GridShape grid = one_grid ? parse_grid(o.grid) : GridShape{};
    PlanChoices choices;
    choices.grid = one_grid ? &grid : nullptr;
    choices.heads_parallel = static_cast<int>(o.heads_parallel);
    if (!traits.grid) {
      for (const std::string& layout : split_list(o.layout))
        choices.layouts.push_back(parse_layout(layout));
    }
    std::vector<Plan> plans = algorithm_plans(algorithm, problem, ranks, choices);
    A2D_REQUIRE(!traits.heads_parallel || !plans.empty(), "--algo ", traits.name,
                ": no U x R x C = ", ranks, " with",
                o.heads_parallel > 0 ? " --heads-parallel " + std::to_string(o.heads_parallel)
                                     : std::string(),
                o.grid.empty() ? std::string() : " --grid " + o.grid);
    for (Plan& plan : plans) {
      plan.stripe = o.stripe;
      plan.threads = static_cast<int>(o.threads);
      if (o.no_kv_transpose) plan.kv_transpose = false;
      Row row;
      row.plan = plan;
      try {
        check_plan(plan, problem, ranks);
      } catch (const Error& e) {
        row.skipped = e.message();
      }
      rows.push_back(row);
    }
  }
  return rows;
}

// The hybrid: U, then the grid of each heads group ("U2 1x2").
std::string grid_column(const Plan& plan) {
  return plan_shape(plan, "-nt");
}

double ratio(double measured, double predicted) {
  return predicted > 0 ? measured / predicted : NAN;
}

cli::JsonLine json_of(const Row& r, const Problem& problem, int ranks, bool backward, bool check) {
  cli::JsonLine line;
  cli::add_plan_fields(line, r.plan);
  line.add("ranks", ranks);
  cli::add_problem_fields(line, problem);
  line.add("dtype", dtype_name(problem.dtype));
  if (!r.skipped.empty()) return line.add("skipped", r.skipped);
  const double flops = forward_flops(problem);
  const PhaseTiming& f = r.timings.forward;
  const PhaseTiming& b = r.timings.backward;
  add_timing_fields(line, "fwd", f, flops, ranks);
  if (backward) {
    add_timing_fields(line, "bwd", b, 2.5 * flops, ranks);
  } else {
    line.add("bwd_ms", NAN).add("bytes_sent_bwd", int64_t{0}).add("messages_bwd", int64_t{0});
  }
  line.add("peak_mem_bytes", r.peak_bytes);
  if (r.flops_balance >= 0) {
    line.add("balance_flops", r.flops_balance)
        .add("balance_tiles_fwd", r.tiles.forward_ratio())
        .add("balance_tiles_bwd", r.tiles.backward_ratio());
  }
  const double pred_fwd = r.predicted ? 1e3 * r.prediction.forward_s : NAN;
  const double pred_bwd = r.predicted && backward ? 1e3 * r.prediction.backward_s : NAN;
  line.add("pred_fwd_ms", pred_fwd)
      .add("pred_bwd_ms", pred_bwd)
      .add("ratio_fwd", ratio(f.median_ms, pred_fwd))
      .add("ratio_bwd", backward ? ratio(b.median_ms, pred_bwd) : NAN)
      .add("model_mem_bytes", r.predicted ? r.prediction.memory_bytes : int64_t{-1});
  // Where the time went: measured wall time per named phase (slowest rank), and the model's
  // time per phase (communication phases, and the kernel as computation alone).
  for (const auto& [name, ms] : r.timings.phase_ms)
    line.add("ms." + name, ms);
  if (r.predicted) {
    for (const PhaseCost& phase : r.prediction.phases)
      line.add("pred_ms." + phase.name, 1e3 * phase.seconds);
    line.add("pred_ms.forward.kernel", 1e3 * r.prediction.forward_compute_s);
    if (backward) line.add("pred_ms.backward.kernel", 1e3 * r.prediction.backward_compute_s);
  }
  if (check) {
    line.add("max_rel_err", r.errors.max())
        .add("pass", r.errors.within(output_bounds(problem.dtype)));
  }
  return line;
}

void print_table(const std::vector<Row>& rows, const Problem& problem, int ranks, bool backward,
                 bool check, const std::string& machine, const std::string& where) {
  std::printf("a2d bench: %s on %s, %s\nprediction: %s\n", problem.describe().c_str(),
              cli::count_of(ranks, "rank").c_str(), where.c_str(), machine.c_str());
  std::printf("%-20s %-11s %9s %9s %9s %9s %8s %11s %11s %8s %9s %9s %7s %7s%s\n", "algorithm",
              "grid", "fwd ms", "(rank", "avg", "max)", "GF/s/rk", "bytes fwd", "bytes bwd", "msgs",
              "bwd ms", "peak MiB", "fwd m/p", "bwd m/p", check ? "  max err" : "");
  const double flops = forward_flops(problem);
  for (const Row& r : rows) {
    if (!r.skipped.empty()) {
      std::printf("%-20s %-11s skipped: %s\n", algorithm_name(r.plan.algorithm).c_str(),
                  grid_column(r.plan).c_str(), r.skipped.c_str());
      continue;
    }
    const PhaseTiming& f = r.timings.forward;
    const PhaseTiming& b = r.timings.backward;
    std::printf(
        "%-20s %-11s %9.2f %9.2f %9.2f %9.2f %8.2f %11lld %11lld %8lld %9.2f %9.1f %7.2f %7.2f",
        algorithm_name(r.plan.algorithm).c_str(), grid_column(r.plan).c_str(), f.median_ms,
        f.rank_min_ms, f.rank_avg_ms, f.rank_max_ms, flops / (f.median_ms * 1e-3) / 1e9 / ranks,
        static_cast<long long>(f.bytes), static_cast<long long>(b.bytes),
        static_cast<long long>(f.messages + b.messages), backward ? b.median_ms : NAN,
        r.peak_bytes / 1048576.0,
        r.predicted ? ratio(f.median_ms, 1e3 * r.prediction.forward_s) : NAN,
        r.predicted && backward ? ratio(b.median_ms, 1e3 * r.prediction.backward_s) : NAN);
    if (check) std::printf("  %.2e", r.errors.max());
    if (r.flops_balance >= 0) {
      std::printf("  balance: flops %.3f tiles fwd %.3f bwd %.3f", r.flops_balance,
                  r.tiles.forward_ratio(), r.tiles.backward_ratio());
    }
    std::printf("\n");
  }
  std::printf(
      "\nfwd ms: median over iterations of the slowest rank (rows timed round-robin unless "
      "--sequential); (rank min avg max): per-rank medians. bytes, msgs: sent per rank and call "
      "(max over ranks), msgs fwd+bwd.\n"
      "balance (--balance): the busiest rank's forward FLOPs, and kernel tiles forward and "
      "backward (the model's replay of the CPU kernels' tiles), over the mean rank's; 1 = "
      "perfect.\n"
      "peak MiB: shards + peak resident growth during a row's first call (max over ranks). m/p: "
      "measured / predicted.\n");
}

void print_csv(const std::vector<Row>& rows, const Problem& problem, int ranks, bool backward,
               bool check) {
  // The keys of the JSON rows as columns (the union, in first-seen order); strings unquoted.
  std::vector<cli::JsonLine> lines;
  std::vector<std::string> keys;
  for (const Row& r : rows) {
    lines.push_back(json_of(r, problem, ranks, backward, check));
    for (const auto& [key, value] : lines.back().fields()) {
      if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
    }
  }
  for (size_t i = 0; i < keys.size(); ++i)
    std::printf("%s%s", i ? "," : "", keys[i].c_str());
  std::printf("\n");
  for (const cli::JsonLine& line : lines) {
    for (size_t i = 0; i < keys.size(); ++i) {
      std::string value;
      for (const auto& [key, v] : line.fields()) {
        if (key == keys[i]) value = v;
      }
      if (value.size() >= 2 && value.front() == '"') value = value.substr(1, value.size() - 2);
      if (value == "null") value.clear();
      // Quote a field holding a comma (skip reasons).
      if (value.find(',') != std::string::npos) value = "\"" + value + "\"";
      std::printf("%s%s", i ? "," : "", value.c_str());
    }
    std::printf("\n");
  }
}

}  // namespace

int bench(int argc, char** argv, int first) {
  if (has_flag(argc, argv, first, "--decode")) return decode_main(argc, argv, first, true);
  return run_counted(&argc, &argv, [&](auto& world, const auto& log) -> int {
    BenchOptions o;
    cli::Options options(
        "a2d bench [options]",
        "Runs every algorithm of the table (or --algo a,b,...) on every grid shape of P (unless "
        "--grid; for the hybrid every U x R x C with U > 1, unless --heads-parallel or --grid) on "
        "the same seeded problem, under mpiexec, and reports per row the slowest rank's median "
        "time, the spread across ranks, GFLOP/s per rank, the bytes and messages each rank sent, "
        "its peak memory, and the cost model's prediction for this machine (its calibration, "
        "`a2d calibrate`) with measured / predicted. Progress goes to rank 0's stderr.");
    o.problem.declare(options);
    o.device.declare(options);
    o.device.declare_comm(options);
    options.add_string("--algo", &o.algos,
                       "comma-separated algorithms (default: every one, " + o.algos + ")");
    options.add_string("--grid", &o.grid,
                       "only this ATTENTION2D grid RxC, or hybrid grid of each heads group "
                       "(default: every one)");
    options.add_int("--heads-parallel", &o.heads_parallel,
                    "hybrid: only this U (default: every U > 1 dividing P)");
    options.add_string("--layout", &o.layout,
                       "layouts of ring and allgather-kv, comma-separated: a row each (default: "
                       "theirs)");
    options.add_flag("--balance", &o.balance,
                     "also report each row's balance: the busiest rank's forward FLOPs and kernel "
                     "tiles (the tile replay) over the mean rank's");
    options.add_int("--stripe", &o.stripe, "stripe width of the striped layout");
    options.add_flag("--no-kv-transpose", &o.no_kv_transpose,
                     "ATTENTION2D without the K/V transpose");
    options.add_int("--threads", &o.threads, "kernel threads per rank");
    options.add_flag("--backward", &o.backward, "also time the backward pass");
    bool decode = false;  // handled by decode_main (decode_command.cpp)
    options.add_flag("--decode", &decode,
                     "instead: time prefill and decode steps (a2d bench --decode --help)");
    options.add_int("--warmup", &o.warmup, "untimed iterations per row");
    options.add_int("--iters", &o.iters, "timed iterations per row (median)");
    options.add_flag("--sequential", &o.sequential,
                     "time the rows one after another (default: round-robin, one call of\n"
                     "every row per round, so that a slow spell of a shared machine falls on one\n"
                     "repeat of many rows, which the median drops, rather than on every repeat\n"
                     "of one row); holds one row's buffers at a time instead of every row's");
    options.add_int("--seed", &o.seed, "seed of the generated inputs");
    options.add_flag("--check", &o.check, "compare every row's outputs with the fp64 reference");
    options.add_flag("--json", &o.json, "one JSON object per row");
    options.add_flag("--csv", &o.csv, "the JSON keys as CSV");
    o.machine.declare(options, false, false, false);
    options.add_flag(
        "--calibrate", &o.calibrate,
        "measure this machine as `a2d calibrate` does (median of 9, at the problem's\n"
        "heads and head dimension, kernel calls timed in regions of up to a second that\n"
        "do at most a row's kernel work per rank) before the rows and again after them,\n"
        "and save the average to the calibration file (--calibration; checked before any\n"
        "work), with the kernel's rates from its\n"
        "timings taken again between the rows' timed rounds (or rows, with\n"
        "--sequential), so that predictions and measurements come from the same span of\n"
        "a shared machine");
    options.add_flag("--no-resample-kernel", &o.no_resample_kernel,
                     "with --calibrate: the kernel's rates from the calibrations before and after\n"
                     "the rows only, not from its timings between the rows' rounds");
    options.add_double("--timeout", &o.timeout,
                       "watchdog: abort the job when no rank made progress for this many seconds "
                       "(0 = off; docs/reliability.md)");
    options.add_flag("--no-memory-check", &o.no_memory_check, kNoMemoryCheckHelp);
    options.add_flag(
        "--quiet", &o.quiet,
        "no progress on stderr (the rows' lines, the prediction, the progress lines)");
    bool help = false;
    Problem problem;
    std::vector<Row> rows;
    std::unique_ptr<Backend> backend;
    CommKind comm_kind = CommKind::mpi;
    MachineChoice machine_choice;
    // A machine file (the links of an emulated cluster) is read before any work and fails loudly;
    // a missing calibration only leaves the rows unpredicted.
    std::unique_ptr<Machine> file_machine;
    collective_check(world, [&] {
      help = !options.parse(argc, argv, first);
      if (help) return;
      A2D_REQUIRE(o.warmup >= 0 && o.iters >= 1, "--warmup must be >= 0 and --iters >= 1");
      A2D_REQUIRE(o.threads >= 1, "--threads must be at least 1");
      A2D_REQUIRE(!(o.json && o.csv), "choose one of --json and --csv");
      A2D_REQUIRE(o.calibrate || !o.no_resample_kernel, "--no-resample-kernel needs --calibrate");
      problem = o.problem.problem(o.device.default_dtype());
      A2D_REQUIRE(o.problem.sink_file.empty(),
                  "a2d bench generates every input from --seed: use --sinks, not --sink FILE");
      rows = candidate_rows(o, problem, world.size());
      backend = o.device.backend(problem.dtype);
      comm_kind = o.device.comm_kind(*backend);
      machine_choice = o.machine.choice();
      if (!machine_choice.machine_file.empty()) {
        file_machine = std::make_unique<Machine>(
            load_machine_file(machine_choice.machine_file, problem.dtype));
        model_ranks_per_node(*file_machine, world.size(), world.size());
      }
      // Where --calibrate will write, before it measures for minutes.
      if (o.calibrate && world.rank() == 0)
        cli::check_output_file("--calibration", machine_choice.calibration_file, true);
    });
    if (o.balance) {
      for (Row& row : rows) {
        if (!row.skipped.empty()) continue;
        row.flops_balance = flops_balance(problem, row.plan);
        row.tiles = tile_balance(problem, row.plan);
      }
    }
    if (help) return 0;
    // Before any row is set up: what the rows need against what each host has
    // (attention2d/memory_check.hpp). Round-robin rows are all set up at once; --sequential
    // holds one at a time.
    const std::string device = o.device.name(problem.dtype);
    {
      MemoryCheck check;
      check.request = {world.size(), problem.seq, problem.dtype};
      check.enabled = !o.no_memory_check;
      // Other rank counts have other rows (grids): a shorter sequence, bf16 or --sequential.
      check.ranks_may_change = false;
      const auto model = [&](const MemoryRequest& r, bool sequential) {
        const Problem p = varied_problem(problem, r);
        const bool on_host = cli::memory_on_host(device);
        const bool copies = p.dtype != DType::f32 || !on_host;
        int64_t shards = 0, buffers = 0, copy_bytes = 0, largest = 0, count = 0;
        for (const Row& row : candidate_rows(o, p, r.ranks)) {
          if (!row.skipped.empty()) continue;
          ++count;
          int64_t row_bytes = 0, row_shards = 0, row_buffers = 0, row_copies = 0;
          for (const MemoryPart& part : plan_parts(p, row.plan, nullptr, o.backward, copies)) {
            if (part.what == "shards") row_shards = on_host ? part.bytes : 0;
            if (part.what == "the algorithm's buffers") row_buffers = on_host ? part.bytes : 0;
            if (part.what == "fp32 host copies of the shards") row_copies = part.bytes;
          }
          row_bytes = row_shards + row_buffers + row_copies;
          largest = std::max(largest, row_bytes);
          shards += row_shards;
          copy_bytes += row_copies;
          buffers = std::max(buffers, row_buffers);
        }
        A2D_REQUIRE(count > 0, "no row can run");
        MemoryNeed need;
        if (sequential) {
          need.every_rank.push_back(
              {"the largest row's shards and buffers (--sequential)", largest});
        } else {
          const std::string counted = std::to_string(count) + (count == 1 ? " row" : " rows");
          need.every_rank.push_back({"shards of " + counted, shards});
          need.every_rank.push_back({"the algorithm's buffers (the largest row's)", buffers});
          if (copy_bytes > 0)
            need.every_rank.push_back({"fp32 host copies of the shards", copy_bytes});
        }
        if (o.check) need.rank0 = bench_rank0_parts(p, o.backward, need.every_rank_bytes());
        return need;
      };
      check.model = [&](const MemoryRequest& r) { return model(r, o.sequential); };
      if (!o.sequential) {
        check.alternatives.push_back({"--sequential (one row at a time)",
                                      [&](const MemoryRequest& r) { return model(r, true); }});
      }
      check_memory(world, check);
    }
    Progress reporter("a2d bench", world.rank() == 0 && !o.quiet);
    const std::unique_ptr<Session> session =
        make_session(world, log, std::move(backend), comm_kind,
                     std::make_unique<Watchdog>(MPI_COMM_WORLD, o.timeout), o.timeout);

    const std::string calibration_file = machine_choice.calibration_file;
    // Progress on rank 0's stderr: what runs now and how much is left.
    const double started = seconds_now();
    const auto progress = [&](const std::string& text) {
      if (world.rank() != 0 || o.quiet) return;
      std::fprintf(stderr, "a2d bench [%6.1f s]: %s\n", seconds_now() - started, text.c_str());
      std::fflush(stderr);
    };
    int runnable = 0;
    for (const Row& row : rows)
      if (row.skipped.empty()) ++runnable;
    const auto row_name = [](const Row& row) {
      return algorithm_name(row.plan.algorithm) + " " + grid_column(row.plan);
    };
    // The prediction (rank 0): every row's calls by this machine's calibration, or an estimate.
    // Per row: its predicted seconds per round and rank 0's kernel entries per round (what the
    // progress lines count).
    std::vector<double> row_s(rows.size(), 0.0), row_entries(rows.size(), 0.0);
    const int64_t rounds = o.warmup + o.iters;
    double check_s = 0;
    if (reporter.enabled()) {
      double flops = 0;
      for (size_t i = 0; i < rows.size(); ++i) {
        if (!rows[i].skipped.empty()) continue;
        flops += busiest_forward_flops(problem, rows[i].plan) * (o.backward ? 3.5 : 1.0);
        row_entries[i] = rank_forward_flops(problem, rows[i].plan, 0) /
                         (4.0 * static_cast<double>(problem.head_dim)) * (o.backward ? 2 : 1);
      }
      const double reference_flops = forward_flops(problem) * (o.backward ? 4.5 : 1.0);
      const double predict_s = ProgressSettings::from_environment().predict_s;
      if (could_take_longer(static_cast<double>(rounds) * flops, static_cast<int>(o.threads),
                            predict_s) ||
          (o.check && reference_flops / (2e9 * reference_threads()) > predict_s)) {
        const LocalMachine local =
            local_machine_for_prediction(world.size(), static_cast<int>(o.threads),
                                         machine_choice.calibration_file, nullptr, problem.dtype);
        double total = 0;
        for (size_t i = 0; i < rows.size(); ++i) {
          if (!rows[i].skipped.empty()) continue;
          const Prediction p = predict(problem, rows[i].plan, local.machine, world.size());
          row_s[i] = p.forward_s + (o.backward ? p.backward_s : 0);
          total += static_cast<double>(rounds) * row_s[i];
        }
        if (o.check)
          check_s = reference_flops / (kReferenceFlopsPerThread * reference_threads());
        std::string what = std::to_string(runnable) + (runnable == 1 ? " row" : " rows") +
                           " of " + std::to_string(rounds) + (rounds == 1 ? " call" : " calls");
        if (o.check) what += ", and the fp64 reference on rank 0 (--check)";
        if (o.calibrate) what += " (and --calibrate's measurements, not predicted)";
        reporter.predict(total + check_s, what, local.source);
      }
    }
    // A stage of calls: `seconds` predicted, `entries` of rank 0's kernel work.
    const auto calls_stage = [&](const std::string& name, int64_t round, double seconds,
                                 double entries) {
      const int64_t start = session->backend().kernel_work();
      reporter.stage(
          name, round + 1, rounds, seconds,
          [&session, start, entries] {
            return static_cast<double>(session->backend().kernel_work() - start) /
                   std::max(1.0, entries);
          },
          [name] { return name + ": " + Watchdog::current_phase(); });
    };
    // --calibrate measures before the rows and again after them, and the rows are predicted with
    // the average of the two and the kernel rates of the span of the rows: a shared machine's
    // speed drifts over a run of minutes.
    CalibrationSettings settings;
    settings.heads = problem.heads;  // the problem's working set per row of the block
    settings.head_dim = problem.head_dim;
    settings.iters = 9;
    settings.threads = o.threads;
    // Timed regions of kernel calls as long as a row's kernel work per rank (up to a second).
    settings.kernel_region_flops = forward_flops(problem) / static_cast<double>(world.size());
    Calibration before;
    // The kernel's timings again between the rows' timed rounds: the kernel is most of a row's
    // time, and this machine's speed moves over minutes (docs/cost-model.md, section 5).
    std::unique_ptr<KernelSampler> kernel_sampler;
    if (o.calibrate) {
      reporter.stage("calibrating this machine (--calibrate)", 0, 0, 0);
      progress("calibrating this machine before the rows (--calibrate)");
      before = measure_calibration(world, settings);
      if (!o.no_resample_kernel) kernel_sampler = std::make_unique<KernelSampler>(world, settings);
    }

    ReferenceOutputs reference;
    if (o.check) {
      progress("computing the fp64 reference (--check)");
      world.set_phase("check");  // rank 0 computes the reference, the others sleep
      const int64_t rows_before = reference_rows_done();
      const double reference_rows_total = reference_rows(problem, o.backward);
      reporter.stage("check: the fp64 reference on rank 0", 0, 0, check_s,
                     [rows_before, reference_rows_total] {
                       return static_cast<double>(reference_rows_done() - rows_before) /
                              reference_rows_total;
                     });
      if (world.rank() == 0) {
        reference = reference_outputs(
            problem, generate_global(problem, static_cast<uint64_t>(o.seed), o.backward),
            o.backward, reference_threads());
      }
      sleeping_barrier(MPI_COMM_WORLD);
    }

    // A row in progress: its algorithm, its shards and its timer.
    struct LiveRow {
      Row* row = nullptr;
      std::unique_ptr<DistributedAttention> attention;
      ShardSet shards;
      std::unique_ptr<AttentionTimer> timer;
    };
    int started_rows = 0;
    const auto start_row = [&](Row& row) {
      ++started_rows;
      progress("row " + std::to_string(started_rows) + "/" + std::to_string(runnable) + ": " +
               row_name(row) + (o.sequential ? "" : " (setting up)"));
      world.set_phase("setup");  // the phase a std::bad_alloc while it is set up names
      auto live = std::make_unique<LiveRow>();
      live->row = &row;
      live->attention = session->attention(problem, row.plan);
      live->shards =
          make_shards(problem, live->attention->layout(), world.rank(),
                      static_cast<uint64_t>(o.seed), true, o.backward, session->backend());
      live->timer = std::make_unique<AttentionTimer>(world, *log, *live->attention, problem,
                                                     live->shards, o.backward);
      return live;
    };
    // Call `round` of a row (rounds below --warmup are not timed). The first call's peak
    // resident growth is the row's peak memory: every call of a row does the same work.
    const auto call_row = [&](LiveRow& live, int64_t round) {
      if (round > 0) {
        live.timer->call(round >= o.warmup);
        return;
      }
      const int64_t growth = peak_memory_growth([&] { live.timer->call(round >= o.warmup); });
      int64_t peak = growth < 0 ? -1 : shard_bytes(live.shards) + growth;
      world.all_reduce(&peak, 1, Reduction::max);
      live.row->peak_bytes = peak;
    };
    const auto finish_row = [&](LiveRow& live) {
      Row& row = *live.row;
      row.timings = live.timer->finish();
      if (o.check) {
        world.set_phase("io");
        const GlobalOutputs outputs =
            gather_outputs(world, 0, problem, live.attention->layout(), live.shards, o.backward);
        double errors[5] = {0, 0, 0, 0, 0};
        if (world.rank() == 0) {
          const OutputErrors e = compare_outputs(outputs, reference, o.backward);
          const double values[5] = {e.out, e.lse, e.dq, e.dk, e.dv};
          std::copy(values, values + 5, errors);
        }
        world.broadcast(errors, sizeof errors, 0);
        row.errors = {errors[0], errors[1], errors[2], errors[3], errors[4]};
      }
    };
    if (o.sequential) {
      for (Row& row : rows) {
        if (!row.skipped.empty()) continue;
        const auto live = start_row(row);
        const size_t index = static_cast<size_t>(&row - rows.data());
        for (int64_t round = 0; round < rounds; ++round) {
          calls_stage(row_name(row), round, row_s[index], row_entries[index]);
          call_row(*live, round);
        }
        finish_row(*live);
        if (kernel_sampler) kernel_sampler->sample();
      }
    } else {
      std::vector<std::unique_ptr<LiveRow>> live;
      for (Row& row : rows)
        if (row.skipped.empty()) live.push_back(start_row(row));
      for (int64_t round = 0; round < rounds; ++round) {
        progress("round " + std::to_string(round + 1) + "/" + std::to_string(rounds) +
                 (round < o.warmup ? " (warm-up)" : " (timed)") + " of " +
                 std::to_string(live.size()) + " rows");
        double round_s = 0, round_entries = 0;
        for (size_t i = 0; i < rows.size(); ++i) {
          round_s += row_s[i];
          round_entries += row_entries[i];
        }
        calls_stage("round " + std::to_string(round + 1) + " of every row", round, round_s,
                    round_entries);
        for (auto& l : live)
          call_row(*l, round);
        if (kernel_sampler && round >= o.warmup) kernel_sampler->sample();
      }
      for (auto& l : live)
        finish_row(*l);
    }

    if (o.calibrate) {
      reporter.stage("calibrating this machine (--calibrate)", 0, 0, 0);
      progress("calibrating this machine after the rows (--calibrate)");
      Calibration measured = average_calibrations(before, measure_calibration(world, settings));
      if (kernel_sampler && kernel_sampler->samples() > 0) kernel_sampler->apply(measured);
      collective_check(world, [&] {
        if (world.rank() == 0) save_calibration(calibration_file, measured);
      });
      progress("saved the calibration of " + std::to_string(world.size()) + " ranks to " +
               cli::absolute_path(calibration_file));
    }
    std::string machine_text = "none: no calibration for this rank count (run a2d calibrate)";
    try {
      Machine machine;
      if (file_machine) {
        machine = o.calibrate
                      ? with_kernel_rates(*file_machine, local_machine(calibration_file,
                                                                       world.size(), problem.dtype))
                      : *file_machine;
      } else {
        machine = local_machine(calibration_file, world.size(), problem.dtype);
      }
      const int per_node = machine.ranks_per_node > 0
                               ? std::min(machine.ranks_per_node, world.size())
                               : world.size();
      machine_text = machine.description;
      for (Row& row : rows) {
        if (!row.skipped.empty()) continue;
        row.prediction = predict(problem, row.plan, machine, per_node);
        row.predicted = true;
      }
    } catch (const Error&) {
    }

    reporter.finish();
    bool pass = true;
    for (const Row& row : rows)
      pass = pass &&
             (!o.check || !row.skipped.empty() || row.errors.within(output_bounds(problem.dtype)));
    if (world.rank() == 0) {
      if (o.json) {
        for (const Row& r : rows)
          std::cout << json_of(r, problem, world.size(), o.backward, o.check).str() << "\n";
      } else if (o.csv) {
        print_csv(rows, problem, world.size(), o.backward, o.check);
      } else {
        print_table(rows, problem, world.size(), o.backward, o.check, machine_text,
                    "device " + session->backend().name() + ", comm " + comm_kind_name(comm_kind));
      }
      std::cout.flush();
    }
    return pass ? 0 : 1;
  }, startup_timeout(argc, argv, first, kDefaultTimeout));
}

}  // namespace a2d::commands
