// The planner: memory per rank, plans that do not fit, ties, the machine a choice resolves to,
// and what a GPU machine refuses (docs/cost-model.md, "The planner").
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "attention2d/cost_model.hpp"
#include "attention2d/error.hpp"
#include "attention2d/planner.hpp"

namespace a2d {
namespace {

std::string error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

Problem gqa(int64_t seq, DType dtype = DType::bf16) {
  Problem p;
  p.seq = seq;
  p.heads = 12;
  p.kv_heads = 4;
  p.head_dim = 80;
  p.mask = Mask::causal();
  p.dtype = dtype;
  return p;
}

std::vector<Plan> every_plan(const Problem& problem, int ranks) {
  PlanChoices choices;
  choices.both_kv_transposes = true;
  std::vector<Plan> plans;
  for (const Algorithm algorithm : all_algorithms()) {
    for (const Plan& plan : algorithm_plans(algorithm, problem, ranks, choices)) {
      try {
        check_plan(plan, problem, ranks);
        plans.push_back(plan);
      } catch (const Error&) {
      }
    }
  }
  return plans;
}

TEST(Planner, MemoryPerRankIsThePredictionsMemoryForEveryPlan) {
  const Machine machine = preset_machine("h100-ndr", DType::bf16);
  int checked = 0;
  for (const int ranks : {1, 3, 4, 6, 8}) {
    for (const DType dtype : {DType::f32, DType::bf16}) {
      const Problem problem = gqa(1001, dtype);
      const UserShards zigzag{TokenLayout(LayoutKind::zigzag, problem.seq, ranks),
                              RelayoutBackward::saved};
      for (const Plan& plan : every_plan(problem, ranks)) {
        const Prediction plain = predict(problem, plan, machine, 4);
        EXPECT_EQ(memory_per_rank(problem, plan), plain.memory_bytes) << plan.describe();
        const Prediction exchanged = predict(problem, plan, machine, 4, &zigzag);
        EXPECT_EQ(memory_per_rank(problem, plan, &zigzag), exchanged.memory_bytes)
            << plan.describe();
        // Without the backward: less (no dO, dQ, dK, dV, nor the backward's buffers), and more
        // than nothing.
        const int64_t forward = memory_per_rank(problem, plan, nullptr, false);
        EXPECT_LT(forward, plain.memory_bytes) << plan.describe();
        EXPECT_GT(forward, 0) << plan.describe();
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 100);
}

TEST(Planner, PresetsAreGpusWithTheirMemory) {
  for (const std::string& name : preset_names()) {
    const Machine m = preset_machine(name, DType::bf16);
    EXPECT_TRUE(m.gpu) << name;
    EXPECT_EQ(m.memory_bytes, int64_t{80} << 30) << name;
  }
  EXPECT_EQ(format_bytes(static_cast<double>(int64_t{80} << 30)), "80 GiB");
  EXPECT_EQ(format_bytes(1.5 * 1048576), "1.5 MiB");
  EXPECT_EQ(format_bytes(512), "512 B");
}

TEST(Planner, SearchExcludesThePlansOverTheCapAndKeepsTheirOrder) {
  const Problem problem = gqa(65536);
  const Machine machine = preset_machine("a100-hdr", DType::bf16);
  const PlanSearch all = search_plans(problem, 16, machine, 4);
  ASSERT_GT(all.ranked.size(), 4u);
  EXPECT_TRUE(all.excluded.empty());
  std::vector<int64_t> memory;
  for (const RankedPlan& r : all.ranked)
    memory.push_back(r.prediction.memory_bytes);
  std::sort(memory.begin(), memory.end());
  const int64_t cap = memory[memory.size() / 2];
  const PlanSearch capped = search_plans(problem, 16, machine, 4, true, false, nullptr, cap);
  EXPECT_EQ(capped.memory_cap, cap);
  EXPECT_EQ(capped.ranked.size() + capped.excluded.size(), all.ranked.size());
  EXPECT_FALSE(capped.ranked.empty());
  EXPECT_FALSE(capped.excluded.empty());
  for (const RankedPlan& r : capped.ranked)
    EXPECT_LE(r.prediction.memory_bytes, cap) << r.plan.describe();
  for (const RankedPlan& r : capped.excluded)
    EXPECT_GT(r.prediction.memory_bytes, cap) << r.plan.describe();
  // The plans that fit keep the order of the whole ranking.
  size_t at = 0;
  for (const RankedPlan& r : all.ranked) {
    if (r.prediction.memory_bytes > cap) continue;
    ASSERT_LT(at, capped.ranked.size());
    EXPECT_EQ(capped.ranked[at++].plan.describe(), r.plan.describe());
  }
}

// Every plan of the ranking is, among the plans after it within the tolerance of the fastest of
// them, the one with the least memory, then the fewest bytes.
void expect_ties_broken_by_memory(const PlanSearch& search) {
  const auto total = [](const RankedPlan& r) {
    return r.prediction.forward_s + r.prediction.backward_s;
  };
  const auto bytes = [](const RankedPlan& r) {
    return r.prediction.forward.bytes + r.prediction.backward.bytes;
  };
  for (size_t i = 0; i < search.ranked.size(); ++i) {
    double fastest = total(search.ranked[i]);
    for (size_t j = i; j < search.ranked.size(); ++j)
      fastest = std::min(fastest, total(search.ranked[j]));
    const RankedPlan& chosen = search.ranked[i];
    EXPECT_LE(total(chosen), fastest * (1 + kPlanTieTolerance));
    for (size_t j = i + 1; j < search.ranked.size(); ++j) {
      const RankedPlan& other = search.ranked[j];
      if (total(other) > fastest * (1 + kPlanTieTolerance)) continue;
      EXPECT_LE(chosen.prediction.memory_bytes, other.prediction.memory_bytes)
          << "#" << i << " " << chosen.plan.describe() << " before " << other.plan.describe();
      if (chosen.prediction.memory_bytes == other.prediction.memory_bytes) {
        EXPECT_LE(bytes(chosen), bytes(other)) << chosen.plan.describe();
      }
    }
  }
}

TEST(Planner, TiesGoToLessMemoryThenFewerBytes) {
  // Compute-bound (N = 2^20 on 64 GPUs): many plans within 1 % of each other.
  Problem problem = gqa(1 << 20);
  problem.heads = 32;
  problem.kv_heads = 8;
  problem.head_dim = 128;
  const Machine file = load_machine_file(
      std::string(A2D_SOURCE_DIR) + "/examples/machines/a100-8x8.machine", DType::bf16);
  const PlanSearch search = search_plans(problem, 64, file, 8, true, true);
  ASSERT_GT(search.ranked.size(), 20u);
  expect_ties_broken_by_memory(search);
  // The same plan in both placements: the machine's own (block) first.
  for (size_t i = 0; i + 1 < search.ranked.size(); ++i) {
    const RankedPlan& a = search.ranked[i];
    const RankedPlan& b = search.ranked[i + 1];
    if (a.plan.describe() == b.plan.describe() &&
        a.prediction.forward_s + a.prediction.backward_s ==
            b.prediction.forward_s + b.prediction.backward_s) {
      EXPECT_FALSE(a.cyclic_placement) << a.plan.describe();
    }
  }
  expect_ties_broken_by_memory(
      search_plans(gqa(8192), 16, preset_machine("h100-ndr", DType::bf16), 4));
}

TEST(Planner, NothingFitsSaysWhatWould) {
  // 2^24 tokens on 8 A100s: the shards alone exceed 80 GiB per rank.
  Problem problem = gqa(int64_t{1} << 24);
  problem.heads = 32;
  problem.kv_heads = 8;
  problem.head_dim = 128;
  MachineChoice choice;
  choice.name = "a100-hdr";
  const std::string message = error_of([&] { choose_plan(problem, 8, 8, choice, "", ""); });
  EXPECT_NE(message.find("no plan fits in 80 GiB per rank on 8 ranks"), std::string::npos)
      << message;
  EXPECT_NE(message.find("What would fit: 32 ranks (4 nodes of 8)"), std::string::npos) << message;
  EXPECT_NE(message.find("--seq "), std::string::npos) << message;
  // The suggestions hold: at 32 ranks, and at the sequence it names, a plan fits.
  EXPECT_NO_THROW(choose_plan(problem, 32, 8, choice, "", ""));
  const size_t at = message.find("--seq ") + 6;
  const int64_t longest = std::stoll(message.substr(at));
  Problem shorter = problem;
  shorter.seq = longest;
  EXPECT_NO_THROW(choose_plan(shorter, 8, 8, choice, "", ""));
  shorter.seq += longest / 50;
  EXPECT_THROW(choose_plan(shorter, 8, 8, choice, "", ""), Error);
  // fp32: bf16 would fit where fp32 does not.
  Problem wide = problem;
  wide.dtype = DType::f32;
  wide.seq = longest;
  EXPECT_NE(what_would_fit(wide, 8, 8, int64_t{80} << 30).find("--dtype bf16"), std::string::npos);
  // No cap: it fits.
  choice.max_memory = 0;
  EXPECT_NO_THROW(choose_plan(problem, 8, 8, choice, "", ""));
  // A cap of our own, below what any plan needs.
  choice.max_memory = 1 << 20;
  EXPECT_NE(error_of([&] { choose_plan(gqa(4096), 4, 4, choice, "", ""); }).find("--max-memory"),
            std::string::npos);
}

TEST(Planner, ChosenPlanFitsAndCarriesItsReasons) {
  MachineChoice choice;
  choice.name = "a100-hdr";
  Problem problem = gqa(65536);
  problem.heads = 32;
  problem.kv_heads = 32;
  const PlannedRun run = choose_plan(problem, 64, 4, choice, "", "");
  EXPECT_EQ(run.memory_cap, int64_t{80} << 30);
  EXPECT_LE(run.prediction.memory_bytes, run.memory_cap);
  EXPECT_EQ(run.runners_up.size(), 2u);
  ASSERT_TRUE(run.best_ring.has_value());
  EXPECT_EQ(run.best_ring->plan.algorithm, Algorithm::ring);
  for (const RankedPlan& r : run.runners_up) {
    EXPECT_NE(r.plan.describe(), run.plan.describe());
    EXPECT_GE(r.prediction.forward_s + r.prediction.backward_s,
              (run.prediction.forward_s + run.prediction.backward_s) / (1 + kPlanTieTolerance));
  }
  // Half the chosen plan's memory as the cap: it is excluded and counted, another is chosen.
  choice.max_memory = run.prediction.memory_bytes - 1;
  const PlannedRun smaller = choose_plan(problem, 64, 4, choice, "", "");
  EXPECT_GT(smaller.excluded, 0);
  EXPECT_LT(smaller.prediction.memory_bytes, run.prediction.memory_bytes);
}

TEST(Planner, GpuMachinesRefuseWhatTheCudaKernelsDoNotTake) {
  const Machine gpu = preset_machine("h100-ndr", DType::bf16);
  Problem problem = gqa(4096);
  EXPECT_NO_THROW(check_machine_runs(gpu, problem));
  problem.head_dim = 63;
  EXPECT_NE(error_of([&] {
              check_machine_runs(gpu, problem);
            }).find("head dimensions 64, 80, 96 and 128, not 63"),
            std::string::npos);
  problem.head_dim = 128;
  problem.dtype = DType::f32;
  EXPECT_NE(error_of([&] { check_machine_runs(gpu, problem); }).find("--dtype bf16"),
            std::string::npos);
  problem.dtype = DType::bf16;
  problem.softcap = 5;
  EXPECT_THROW(check_machine_runs(gpu, problem), Error);
  problem.softcap = 0;
  problem.mask = problem.mask.with_documents({2048, 2048});
  EXPECT_THROW(check_machine_runs(gpu, problem), Error);
  // A CPU machine computes everything.
  Machine cpu = gpu;
  cpu.gpu = false;
  problem.head_dim = 63;
  EXPECT_NO_THROW(check_machine_runs(cpu, problem));
}

TEST(Planner, RanksPerNodeMustDivideTheRanksTheySpan) {
  Machine machine;
  EXPECT_EQ(model_ranks_per_node(machine, 8, 64), 8);
  EXPECT_EQ(model_ranks_per_node(machine, 8, 4), 4);  // one node, partly used
  EXPECT_NE(error_of([&] { model_ranks_per_node(machine, 8, 63); })
                .find("63 ranks on nodes of 8 (--gpus-per-node) leave a node partly filled; "
                      "give a multiple of 8 ranks (56 or 64)"),
            std::string::npos);
  machine.ranks_per_node = 6;  // a machine file's
  EXPECT_NE(error_of([&] { model_ranks_per_node(machine, 8, 16); }).find("ranks_per_node"),
            std::string::npos);
}

TEST(Planner, TheDefaultMachineIsThisOnesCalibrationElseANamedPreset) {
  const std::string file = ::testing::TempDir() + "/a2d-planner-calibration.txt";
  std::remove(file.c_str());
  MachineChoice choice;
  choice.calibration_file = file;
  // No calibration: the named default preset, saying so, and bf16 (a GPU machine).
  EXPECT_TRUE(choice.gpu(4));
  EXPECT_EQ(choice.default_dtype(4), DType::bf16);
  const Machine preset = choice.machine(4, DType::bf16);
  EXPECT_EQ(preset.name, kDefaultMachine);
  EXPECT_NE(preset.description.find("the default machine: no calibration of this machine for 4"),
            std::string::npos)
      << preset.description;
  // Calibrated at 4 ranks: this machine there (fp32, its memory shared by the ranks), the preset
  // elsewhere.
  Calibration c;
  c.ranks = 4;
  c.cores = 2;
  c.kernel_forward_flops = c.kernel_backward_flops = 1e10;
  c.latency_s = 1e-6;
  c.bytes_per_s = 1e9;
  save_calibration(file, c);
  EXPECT_FALSE(choice.gpu(4));
  EXPECT_EQ(choice.default_dtype(4), DType::f32);
  const Machine local = choice.machine(4, DType::f32);
  EXPECT_EQ(local.name, "local");
  EXPECT_FALSE(local.gpu);
  EXPECT_GT(local.memory_bytes, 0);
  EXPECT_EQ(choice.machine(8, DType::bf16).name, kDefaultMachine);
  // A name and a file contradict each other; an unknown name is refused.
  choice.name = "a100-hdr";
  choice.machine_file = file;
  EXPECT_NE(error_of([&] { choice.machine(4, DType::bf16); }).find("contradict"),
            std::string::npos);
  choice.machine_file.clear();
  choice.name = "tpu";
  EXPECT_THROW(choice.gpu(4), Error);
  std::remove(file.c_str());
}

}  // namespace
}  // namespace a2d
