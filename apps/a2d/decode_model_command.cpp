// a2d model --decode: the cost model of prefill and decode (docs/inference.md), no MPI, no data.
#include <cstdio>
#include <cstring>
#include <iostream>

#include "attention2d/cost_model.hpp"
#include "attention2d/error.hpp"
#include "attention2d/inference.hpp"
#include "attention2d/planner.hpp"
#include "attention2d/tools/cli.hpp"
#include "commands.hpp"
#include "problem_options.hpp"

namespace a2d::commands {

bool has_flag(int argc, char** argv, int first, const char* flag) {
  for (int i = first; i < argc; ++i)
    if (!std::strcmp(argv[i], flag)) return true;
  return false;
}

int model_decode(int argc, char** argv, int first) {
  cli::ProblemOptions problem_options;
  problem_options.causal = true;
  cli::MachineOptions machine_options;
  int64_t gpus = 16, gpus_per_node = 8, prompt = 4096, steps = 1024, tokens_per_step = 1;
  bool json = false, decode = true;
  cli::Options options(
      "a2d model --decode [options]",
      "Predicts, for every plan of the prompt's forward (the prefill), the prefill time and the\n"
      "time, bytes and messages of a decode step of --tokens-per-step tokens at the first and\n"
      "the last step (cache --prompt and --prompt + (--steps - 1) x --tokens-per-step), and the\n"
      "steps per second over the run. docs/inference.md derives it.");
  problem_options.dtype_by_machine = true;
  problem_options.declare(options);
  options.add_flag("--decode", &decode, "the decode model (this table)");
  options.add_int("--prompt", &prompt, "prompt tokens N");
  options.add_int("--steps", &steps, "decode steps S");
  options.add_int("--tokens-per-step", &tokens_per_step, "new tokens T per step");
  machine_options.declare(options, true, false, true);
  options.add_int("--gpus", &gpus, "ranks P");
  options.add_int("--gpus-per-node", &gpus_per_node,
                  "ranks per node (consecutive ranks share one); P must be a multiple where it "
                  "is larger");
  options.add_flag("--json", &json, "one JSON object per line");
  if (!options.parse(argc, argv, first)) return 0;
  A2D_REQUIRE(!options.given("--seq"), "a2d model --decode takes the prompt length as --prompt N");
  A2D_REQUIRE(prompt >= 1 && steps >= 1 && tokens_per_step >= 1,
              "--prompt, --steps and --tokens-per-step must be at least 1");
  A2D_REQUIRE(gpus >= 1 && gpus <= (1 << 16), "--gpus must be between 1 and 2^16");
  A2D_REQUIRE(gpus_per_node >= 1, "--gpus-per-node must be at least 1");
  problem_options.seq = prompt;
  const int ranks = static_cast<int>(gpus);
  const MachineChoice choice = machine_options.choice();
  const Problem problem = problem_options.problem(choice.default_dtype(ranks));
  check_decodable(problem);
  const Machine machine = choice.machine(ranks, problem.dtype);
  const int per_node = model_ranks_per_node(
      machine, static_cast<int>(std::min<int64_t>(gpus_per_node, ranks)), ranks);
  const PlanSearch search = search_plans(problem, ranks, machine, per_node, false);
  const int64_t last = prompt + (steps - 1) * tokens_per_step;
  if (!json) {
    std::printf(
        "a2d model --decode: %s\nmachine: %s (%s)\n%s, %d per node; %lld steps of "
        "%lld tokens after a prompt of %lld\n\n",
        problem.describe().c_str(), machine.name.c_str(), machine.description.c_str(),
        cli::count_of(ranks, "rank").c_str(), per_node, static_cast<long long>(steps),
        static_cast<long long>(tokens_per_step), static_cast<long long>(prompt));
    std::printf("%-4s %-20s %-14s %11s %13s %13s %12s %9s %11s %12s\n", "#", "prefill algorithm",
                "grid/layout", "prefill ms", "step ms first", "step ms last", "bytes/step",
                "messages", "steps/s", "cache MiB");
  }
  int index = 1;
  for (const RankedPlan& r : search.ranked) {
    if (r.cyclic_placement) continue;
    const DecodePrediction a =
        predict_decode_step(problem, r.plan, machine, per_node, prompt, tokens_per_step);
    const DecodePrediction b =
        predict_decode_step(problem, r.plan, machine, per_node, last, tokens_per_step);
    // Step time is linear in the cache length: the mean of the first and last step.
    const double steps_per_s = 2.0 / (a.step_s + b.step_s);
    const AlgorithmTraits& traits = algorithm_traits(r.plan.algorithm);
    const std::string grid = traits.grid && !traits.heads_parallel
                                 ? plan_shape(r.plan, " no-transpose")
                                 : layout_name(r.plan.layout);
    const double cache_mib = static_cast<double>(b.cache_bytes) / (1 << 20);
    if (json) {
      cli::JsonLine j;
      j.add("rank", index)
          .add("algorithm", algorithm_name(r.plan.algorithm))
          .add("grid", grid)
          .add("layout", layout_name(r.plan.layout))
          .add("prefill_ms", r.prediction.forward_s * 1e3)
          .add("step_ms_first", a.step_s * 1e3)
          .add("step_ms_last", b.step_s * 1e3)
          .add("step_kernel_ms_last", b.kernel_s * 1e3)
          .add("step_comm_ms", a.comm_s * 1e3)
          .add("bytes_per_step", std::max(a.traffic.bytes, b.traffic.bytes))
          .add("messages_per_step", std::max(a.traffic.messages, b.traffic.messages))
          .add("steps_per_s", steps_per_s)
          .add("cache_bytes_per_rank", b.cache_bytes);
      std::cout << j.str() << "\n";
    } else {
      std::printf("%-4d %-20s %-14s %11.3f %13.4f %13.4f %12lld %9lld %11.1f %12.2f\n", index,
                  algorithm_name(r.plan.algorithm).c_str(), grid.c_str(),
                  r.prediction.forward_s * 1e3, a.step_s * 1e3, b.step_s * 1e3,
                  static_cast<long long>(std::max(a.traffic.bytes, b.traffic.bytes)),
                  static_cast<long long>(std::max(a.traffic.messages, b.traffic.messages)),
                  steps_per_s, cache_mib);
    }
    ++index;
  }
  return 0;
}

}  // namespace a2d::commands
