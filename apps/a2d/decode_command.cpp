// a2d decode and a2d bench --decode: prefill a prompt into the distributed KV cache, then decode
// steps of T tokens under mpiexec (docs/inference.md).
//
//   mpirun -np P a2d decode --prompt N --steps S --tokens-per-step T --heads H --kv-heads G
//          --head-dim D --causal [--algo A --grid RxC --layout L] [--check] [--json]
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <numeric>
#include <sstream>
#include <vector>

#include "attention2d/collective.hpp"
#include "attention2d/cost_model.hpp"
#include "attention2d/error.hpp"
#include "attention2d/inference.hpp"
#include "attention2d/memory_check.hpp"
#include "attention2d/mpi_comm.hpp"
#include "attention2d/planner.hpp"
#include "attention2d/tools/check.hpp"
#include "attention2d/tools/decode_harness.hpp"
#include "attention2d/tools/harness.hpp"
#include "attention2d/tools/progress.hpp"
#include "attention2d/watchdog.hpp"
#include "commands.hpp"
#include "memory_needs.hpp"
#include "problem_options.hpp"
#include "run_support.hpp"

namespace a2d::commands {
namespace {

struct DecodeOptions {
  cli::ProblemOptions problem;
  cli::PlanOptions plan;
  cli::DeviceOptions device;
  int64_t prompt = 1024;
  int64_t steps = 16;
  int64_t tokens_per_step = 1;
  int64_t capacity = 0;
  int64_t seed = 42;
  int64_t gpus_per_node = 0;  // 0: every rank on one node
  bool check = false;
  bool json = false;
  bool no_memory_check = false;
  bool quiet = false;
};

// The largest a rank's KV cache gets, in tokens held at once: it starts at the prompt's shard (or
// `capacity`) and doubles as tokens arrive, the old and the new cache both held while it copies
// (inference.hpp).
int64_t cache_peak_tokens(int64_t start, int64_t final_tokens) {
  int64_t capacity = std::max<int64_t>(1, start), peak = capacity;
  while (capacity < final_tokens) {
    const int64_t grown = 2 * capacity;
    peak = std::max(peak, capacity + grown);
    capacity = grown;
  }
  return peak;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace

int decode_main(int argc, char** argv, int first, bool bench) {
  return run_counted(&argc, &argv, [&](auto& world, const auto& log) -> int {
    DecodeOptions o;
    cli::Options options(
        bench ? "a2d bench --decode [options]" : "a2d decode [options]",
        "Prefills a prompt of --prompt tokens into a KV cache distributed over the ranks of the\n"
        "MPI job (the planned forward; the cache keeps each rank's K/V shard), then runs --steps\n"
        "decode steps of --tokens-per-step new tokens: each is cached at the rank with the\n"
        "fewest tokens, and their attention over the whole cache is merged across ranks (the\n"
        "split-KV reduction). Reports the slowest rank's time per step, steps per second, the\n"
        "bytes each rank sends per step, and the cost model's prediction; --check compares the\n"
        "new tokens' O and LSE of every step with the fp64 reference of the whole sequence.");
    o.problem.declare(options);
    o.plan.declare(options);
    o.device.declare(options);
    o.device.declare_comm(options);
    options.add_int("--prompt", &o.prompt, "prompt tokens N (the prefill)");
    options.add_int("--steps", &o.steps, "decode steps S");
    options.add_int("--tokens-per-step", &o.tokens_per_step, "new tokens T per step (>= 1)");
    options.add_int(
        "--capacity", &o.capacity,
        "cache tokens to reserve per rank (0: the prompt's shard; it doubles when full)");
    options.add_int("--gpus-per-node", &o.gpus_per_node,
                    "ranks per node for the prediction (0: all on one node)");
    options.add_int("--seed", &o.seed, "seed of the generated tokens");
    options.add_flag(
        "--check", &o.check,
        "compare every step's O and LSE with the fp64 reference; exit 1 over the bound");
    options.add_flag("--json", &o.json, "one JSON object instead of the report");
    options.add_flag("--no-memory-check", &o.no_memory_check, kNoMemoryCheckHelp);
    options.add_flag("--quiet", &o.quiet, kQuietHelp);
    bool decode_flag = bench;  // a2d bench --decode: the flag that chose this table
    if (bench) options.add_flag("--decode", &decode_flag, "time decode steps (this table)");
    bool asked_help = false;
    Problem problem;
    Plan plan;
    std::string chosen;
    std::unique_ptr<Backend> backend;
    CommKind comm_kind = CommKind::mpi;
    // Every argument is checked on every rank, before any data moves.
    collective_check(world, [&] {
      asked_help = !options.parse(argc, argv, first);
      if (asked_help) return;
      A2D_REQUIRE(!options.given("--seq"),
                  "a2d decode takes the prompt length as --prompt N (the sequence grows by "
                  "--steps x --tokens-per-step)");
      A2D_REQUIRE(o.prompt >= 1, "--prompt must be at least 1 token, got ", o.prompt);
      A2D_REQUIRE(o.steps >= 1, "--steps must be at least 1, got ", o.steps);
      A2D_REQUIRE(o.tokens_per_step >= 1, "--tokens-per-step must be at least 1, got ",
                  o.tokens_per_step);
      A2D_REQUIRE(o.capacity >= 0, "--capacity must be >= 0 tokens, got ", o.capacity);
      A2D_REQUIRE(o.gpus_per_node >= 0, "--gpus-per-node must be >= 0");
      o.problem.seq = o.prompt;
      // Decoding is causal (--window narrows it); a window with a right side or a range mask is
      // taken as given, for check_decodable to refuse saying why.
      if (o.problem.window_size.empty() && o.problem.mask_ranges.empty()) o.problem.causal = true;
      problem = o.problem.problem(o.device.default_dtype());
      check_decodable(problem);
      plan = o.plan.plan(problem, world.size(), &chosen);
      backend = o.device.backend(problem.dtype);
      comm_kind = o.device.comm_kind(*backend);
    });
    if (asked_help) return 0;
    // Before the decoder and its tokens exist: what they need against what each host has
    // (attention2d/memory_check.hpp).
    {
      const std::string device = o.device.name(problem.dtype);
      MemoryCheck check;
      check.request = {world.size(), o.prompt, problem.dtype};
      check.seq_option = "--prompt";
      check.enabled = !o.no_memory_check;
      check.model = [&](const MemoryRequest& r) {
        const Problem p = varied_problem(problem, r);
        const Plan varied = varied_plan(plan, p, r.ranks);
        const bool on_host = cli::memory_on_host(device);
        const int64_t prompt_tokens = plan_layout(p, varied).max_count();
        const int64_t steps_tokens = o.steps * o.tokens_per_step;
        MemoryNeed need;
        if (on_host) {
          const RankMemory prefill = memory_parts(p, varied, nullptr, false);
          need.every_rank.push_back({"the prompt's shards", prefill.shards});
          need.every_rank.push_back({"the prefill's buffers", prefill.buffers});
          const int64_t record = p.batch * p.kv_heads * 2 * p.head_dim * dtype_bytes(p.dtype) + 8;
          const int64_t final_tokens = prompt_tokens + (steps_tokens + r.ranks - 1) / r.ranks;
          need.every_rank.push_back(
              {"the KV cache at its largest",
               record * cache_peak_tokens(std::max(o.capacity, prompt_tokens), final_tokens)});
        }
        need.every_rank.push_back({"fp32 host copies of the prompt's tokens",
                                   harness_copy_bytes(p, prompt_tokens, false)});
        if (o.check) {
          const int64_t total_tokens = r.seq + steps_tokens;
          need.every_rank.push_back({"the fp64 reference's K and V (--check, on every rank)",
                                     8 * 2 * p.batch * total_tokens * p.kv_heads * p.head_dim});
        }
        return need;
      };
      check_memory(world, check);
    }
    Progress reporter(bench ? "a2d bench --decode" : "a2d decode", world.rank() == 0 && !o.quiet);
    const std::unique_ptr<Session> session =
        make_session(world, log, std::move(backend), comm_kind, nullptr, 0);
    Backend& device = session->backend();
    const int ranks = world.size(), rank = world.rank();
    const int64_t total = o.prompt + o.steps * o.tokens_per_step;
    const auto seed = static_cast<uint64_t>(o.seed);

    // The prediction (rank 0): the prefill and the steps, by this machine's calibration or an
    // estimate.
    double prefill_predicted_s = 0, step_predicted_s = 0;
    if (reporter.enabled()) {
      const double flops =
          busiest_forward_flops(problem, plan) +
          4.0 * static_cast<double>(o.steps * o.tokens_per_step) *
              static_cast<double>(total * problem.heads * problem.head_dim * problem.batch) / ranks;
      if (could_take_longer(flops, plan.threads, ProgressSettings::from_environment().predict_s)) {
        const std::string file = o.plan.machine.calibration.empty() ? default_calibration_file()
                                                                    : o.plan.machine.calibration;
        const LocalMachine local = local_machine_for_prediction(ranks, plan.threads, file, nullptr, problem.dtype);
        prefill_predicted_s = predict(problem, plan, local.machine, ranks).forward_s;
        step_predicted_s = 0.5 * (predict_decode_step(problem, plan, local.machine, ranks, o.prompt,
                                                      o.tokens_per_step)
                                      .step_s +
                                  predict_decode_step(problem, plan, local.machine, ranks,
                                                      total - o.tokens_per_step, o.tokens_per_step)
                                      .step_s);
        reporter.predict(prefill_predicted_s + static_cast<double>(o.steps) * step_predicted_s,
                         "the prefill and " + std::to_string(o.steps) + " decode steps",
                         local.source);
      }
    }
    const auto phase = [] { return Watchdog::current_phase(); };
    const std::unique_ptr<DistributedDecoder> decoder = session->decoder(problem, plan, o.capacity);
    std::unique_ptr<DecodeReference> reference;
    if (o.check) reference = std::make_unique<DecodeReference>(problem, seed, total);
    double worst_out = 0, worst_lse = 0;
    const auto check_tokens = [&](DecodeTokens& tokens) {
      if (!reference) return;
      tokens.download();
      const DecodeErrors mine = reference->errors(tokens, 1);
      double sums[4] = {mine.out_error, mine.out_norm, mine.lse_error, mine.lse_norm};
      world.all_reduce(sums, 4, Reduction::sum);
      const DecodeErrors all{sums[0], sums[1], sums[2], sums[3]};
      worst_out = std::max(worst_out, all.out());
      worst_lse = std::max(worst_lse, all.lse());
    };

    // The prefill, timed once.
    DecodeTokens prompt =
        make_decode_tokens(problem, device, seed, total, decoder->prompt_layout().tokens_of(rank));
    world.barrier();
    log->clear();
    const int64_t prefill_start = device.kernel_work();
    const double prefill_entries =
        rank_forward_flops(problem, plan, 0) / (4.0 * static_cast<double>(problem.head_dim));
    reporter.stage(
        "prefill", 0, 0, prefill_predicted_s,
        [&device, prefill_start, prefill_entries] {
          return static_cast<double>(device.kernel_work() - prefill_start) /
                 std::max(1.0, prefill_entries);
        },
        phase);
    double t0 = MPI_Wtime();
    decoder->prefill(prompt.forward());
    double prefill_s = MPI_Wtime() - t0;
    const Traffic prefill_traffic = log->total();
    world.all_reduce(&prefill_s, 1, Reduction::max);
    check_tokens(prompt);

    std::vector<double> step_s(static_cast<size_t>(o.steps));
    std::vector<int64_t> step_bytes(static_cast<size_t>(o.steps)),
        step_messages(static_cast<size_t>(o.steps));
    std::vector<int64_t> lengths(static_cast<size_t>(o.steps));
    for (int64_t s = 0; s < o.steps; ++s) {
      reporter.stage("decode step", s + 1, o.steps, step_predicted_s, {}, phase);
      const DecodeStep step = decoder->next_step(o.tokens_per_step);
      lengths[static_cast<size_t>(s)] = step.first_position;
      DecodeTokens fresh =
          make_decode_tokens(problem, device, seed, total, step.positions_of(rank));
      log->clear();
      world.barrier();
      t0 = MPI_Wtime();
      decoder->step(o.tokens_per_step, fresh.decode());
      step_s[static_cast<size_t>(s)] = MPI_Wtime() - t0;
      const Traffic t = log->total("decode");
      step_bytes[static_cast<size_t>(s)] = t.bytes;
      step_messages[static_cast<size_t>(s)] = t.messages;
      check_tokens(fresh);
    }
    // The slowest rank per step, the most any rank sent per step.
    world.all_reduce(step_s.data(), o.steps, Reduction::max);
    world.all_reduce(step_bytes.data(), o.steps, Reduction::max);
    world.all_reduce(step_messages.data(), o.steps, Reduction::max);
    int64_t reallocations = decoder->reallocations();
    world.all_reduce(&reallocations, 1, Reduction::max);

    // The model's prediction beside the measurement: this machine's calibration (or the machine
    // file, or --machine as named); none from a default preset, which is not this machine.
    double predicted_step_s = -1, predicted_prefill_s = -1;
    int64_t predicted_bytes = -1;
    std::string machine_name = "n/a";
    {
      // The bytes do not depend on the machine (any machine's prediction carries them).
      const Machine any = preset_machine(kDefaultMachine, problem.dtype);
      const int per_node = o.gpus_per_node > 0 ? static_cast<int>(o.gpus_per_node) : ranks;
      predicted_bytes =
          std::max(predict_decode_step(problem, plan, any, per_node, o.prompt, o.tokens_per_step)
                       .traffic.bytes,
                   predict_decode_step(problem, plan, any, per_node, total - o.tokens_per_step,
                                       o.tokens_per_step)
                       .traffic.bytes);
    }
    try {
      MachineChoice choice = o.plan.machine.choice();
      if (choice.name.empty() && choice.machine_file.empty()) choice.name = "local";
      const Machine machine = choice.machine(ranks, problem.dtype);
      machine_name = machine.name;
      const int per_node = o.gpus_per_node > 0 ? static_cast<int>(o.gpus_per_node) : ranks;
      const DecodePrediction first_step =
          predict_decode_step(problem, plan, machine, per_node, o.prompt, o.tokens_per_step);
      const DecodePrediction last_step = predict_decode_step(
          problem, plan, machine, per_node, total - o.tokens_per_step, o.tokens_per_step);
      predicted_step_s = 0.5 * (first_step.step_s + last_step.step_s);
      predicted_prefill_s = predict(problem, plan, machine, per_node).forward_s;
    } catch (const Error&) {
      // No calibration of this machine: the report's times say n/a.
    }

    reporter.finish();
    const double median_step = median(step_s);
    const double total_steps_s = std::accumulate(step_s.begin(), step_s.end(), 0.0);
    const int64_t max_bytes = *std::max_element(step_bytes.begin(), step_bytes.end());
    const int64_t max_messages = *std::max_element(step_messages.begin(), step_messages.end());
    const double bound_out = output_bounds(problem.dtype).out;
    const double bound_lse = output_bounds(problem.dtype).lse;
    const bool pass = !o.check || (worst_out <= bound_out && worst_lse <= bound_lse);
    if (rank == 0) {
      const double steps_per_s =
          total_steps_s > 0 ? static_cast<double>(o.steps) / total_steps_s : 0.0;
      if (o.json) {
        cli::JsonLine j;
        j.add("command", bench ? "bench-decode" : "decode")
            .add("problem", problem.describe())
            .add("plan", plan.describe())
            .add("ranks", ranks)
            .add("device", device.name())
            .add("comm", comm_kind_name(comm_kind))
            .add("prompt", o.prompt)
            .add("steps", o.steps)
            .add("tokens_per_step", o.tokens_per_step)
            .add("prefill_ms", prefill_s * 1e3)
            .add("prefill_bytes", prefill_traffic.bytes)
            .add("step_ms_median", median_step * 1e3)
            .add("step_ms_first", step_s.front() * 1e3)
            .add("step_ms_last", step_s.back() * 1e3)
            .add("steps_per_s", steps_per_s)
            .add("tokens_per_s", steps_per_s * static_cast<double>(o.tokens_per_step))
            .add("bytes_per_step", max_bytes)
            .add("messages_per_step", max_messages)
            .add("cache_reallocations", reallocations)
            .add("machine", machine_name)
            .add("predicted_step_ms", predicted_step_s * 1e3)
            .add("predicted_bytes_per_step", predicted_bytes)
            .add("predicted_prefill_ms", predicted_prefill_s * 1e3);
        if (o.check) {
          j.add("error_out", worst_out).add("error_lse", worst_lse).add("pass", pass);
        }
        std::cout << j.str() << std::endl;
      } else {
        if (!chosen.empty()) std::cout << chosen << "\n";
        std::printf("%s: %s\nprefill plan: %s, %s, device %s, comm %s\n",
                    bench ? "a2d bench --decode" : "a2d decode", problem.describe().c_str(),
                    plan.describe().c_str(), cli::count_of(ranks, "rank").c_str(),
                    device.name().c_str(), comm_kind_name(comm_kind).c_str());
        std::printf("prompt %lld tokens, %lld steps of %lld tokens (cache %lld -> %lld tokens)\n",
                    static_cast<long long>(o.prompt), static_cast<long long>(o.steps),
                    static_cast<long long>(o.tokens_per_step), static_cast<long long>(o.prompt),
                    static_cast<long long>(total));
        const auto predicted = [](double s) {
          return s < 0 ? std::string("n/a") : cli::format_double(s * 1e3, 3);
        };
        std::printf("%-8s %12s %12s %12s %14s %10s %14s %14s %10s\n", "phase", "ms median",
                    "ms first", "ms last", "steps/s", "bytes", "messages", "predicted ms",
                    "meas/pred");
        std::printf("%-8s %12.3f %12s %12s %14s %10lld %14lld %14s %10s\n", "prefill",
                    prefill_s * 1e3, "-", "-", "-", static_cast<long long>(prefill_traffic.bytes),
                    static_cast<long long>(prefill_traffic.messages),
                    predicted(predicted_prefill_s).c_str(),
                    predicted_prefill_s > 0
                        ? cli::format_double(prefill_s / predicted_prefill_s, 2).c_str()
                        : "n/a");
        std::printf("%-8s %12.3f %12.3f %12.3f %14.1f %10lld %14lld %14s %10s\n", "step",
                    median_step * 1e3, step_s.front() * 1e3, step_s.back() * 1e3, steps_per_s,
                    static_cast<long long>(max_bytes), static_cast<long long>(max_messages),
                    predicted(predicted_step_s).c_str(),
                    predicted_step_s > 0
                        ? cli::format_double(median_step / predicted_step_s, 2).c_str()
                        : "n/a");
        std::printf(
            "bytes per step: %lld measured (the most any rank sent in a step), %lld by "
            "the model (docs/inference.md); cache reallocations per rank: %lld; machine: "
            "%s\n",
            static_cast<long long>(max_bytes), static_cast<long long>(predicted_bytes),
            static_cast<long long>(reallocations), machine_name.c_str());
        if (o.check) {
          std::printf(
              "check: O error %.3g (bound %.3g), LSE error %.3g (bound %.3g), worst step "
              "of the prefill and %lld steps: %s\n",
              worst_out, bound_out, worst_lse, bound_lse, static_cast<long long>(o.steps),
              pass ? "PASS" : "FAIL");
        }
      }
    }
    return pass ? 0 : 1;
  });
}

int decode(int argc, char** argv, int first) {
  return decode_main(argc, argv, first, false);
}

}  // namespace a2d::commands
