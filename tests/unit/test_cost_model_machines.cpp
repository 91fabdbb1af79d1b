// The cost model's machines: presets, calibration files (written, read, averaged, fitted) and
// machine files.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <numeric>
#include <sstream>
#include <vector>

#include "attention2d/cost_model.hpp"
#include "attention2d/decomposition.hpp"
#include "attention2d/error.hpp"
#include "cost_model_case.hpp"

namespace a2d {
namespace {

using namespace cost_model_case;

TEST(CostModel, MachinesAndCalibrationFiles) {
  EXPECT_THROW(preset_machine("tpu", DType::bf16), Error);
  const std::string file = ::testing::TempDir() + "/a2d-calibration-test.txt";
  std::remove(file.c_str());
  EXPECT_THROW(local_machine(file, 4), Error);
  Calibration c;
  c.ranks = 4;
  c.cores = 2;
  c.kernel_forward_flops = 20e9;
  c.kernel_backward_flops = 15e9;
  c.kernel_forward_causal_flops = 10e9;
  c.kernel_backward_causal_flops = 5e9;
  c.block = 0;  // no kernel-tile model: the causal rates apply to causal problems
  c.latency_s = 2e-6;
  c.bytes_per_s = 3e9;
  save_calibration(file, c);
  c.ranks = 9;
  c.kernel_forward_flops = 7e9;
  save_calibration(file, c);
  const Machine four = local_machine(file, 4), nine = local_machine(file, 9);
  EXPECT_DOUBLE_EQ(four.kernel_forward_flops, 20e9);
  EXPECT_DOUBLE_EQ(nine.kernel_forward_flops, 7e9);
  EXPECT_DOUBLE_EQ(four.intra.bytes_per_s, 3e9);
  EXPECT_EQ(four.shared_cores, 2);
  EXPECT_DOUBLE_EQ(four.kernel_forward_causal_flops, 10e9);
  EXPECT_DOUBLE_EQ(four.kernel_backward_causal_flops, 5e9);
  EXPECT_THROW(local_machine(file, 16), Error);
  // Without bf16 rates of its own, bf16 runs at the fp32 ones.
  EXPECT_DOUBLE_EQ(local_machine(file, 4, DType::bf16).kernel_forward_flops, 20e9);
  // Files from before the synchronisation, sorting and forward-overhead terms: none charged.
  EXPECT_EQ(four.sync_s, 0.0);
  EXPECT_EQ(four.step_sync_s, 0.0);
  EXPECT_EQ(four.permute_bytes_per_s, 0.0);
  EXPECT_EQ(four.kernel_forward_panel_s, 0.0);
  EXPECT_EQ(four.kernel_forward_key_s, 0.0);
  EXPECT_EQ(four.sum_bytes_per_s, 0.0);
  EXPECT_EQ(four.merge_bytes_per_s, 0.0);
  c.ranks = 3;
  c.sync_s = 2e-3;
  c.step_sync_s = 1e-3;
  c.permute_bytes_per_s = 5e9;
  c.kernel_forward_panel_s = 3e-6;
  c.kernel_forward_key_s = 2e-8;
  c.sum_bytes_per_s = 3e9;
  c.merge_bytes_per_s = 1.5e9;
  save_calibration(file, c);
  // bf16 rates of its own (the amx and avx512bf16 paths'): used for bf16 problems only.
  c.kernel_forward_flops_bf16 = 80e9;
  c.kernel_backward_flops_bf16 = 60e9;
  c.kernel_forward_causal_flops_bf16 = 40e9;
  c.kernel_backward_causal_flops_bf16 = 30e9;
  save_calibration(file, c);
  const Machine three = local_machine(file, 3);
  const Machine three_bf16 = local_machine(file, 3, DType::bf16);
  EXPECT_DOUBLE_EQ(three.kernel_forward_flops, 7e9);
  EXPECT_DOUBLE_EQ(three_bf16.kernel_forward_flops, 80e9);
  EXPECT_DOUBLE_EQ(three_bf16.kernel_backward_flops, 60e9);
  EXPECT_DOUBLE_EQ(three_bf16.kernel_forward_causal_flops, 40e9);
  EXPECT_DOUBLE_EQ(three_bf16.kernel_backward_causal_flops, 30e9);
  EXPECT_DOUBLE_EQ(local_machine(file, 3, DType::f16).kernel_forward_flops, 7e9);
  EXPECT_DOUBLE_EQ(three.sum_bytes_per_s, 3e9);
  EXPECT_DOUBLE_EQ(three.merge_bytes_per_s, 1.5e9);
  EXPECT_DOUBLE_EQ(three.sync_s, 2e-3);
  EXPECT_DOUBLE_EQ(three.step_sync_s, 1e-3);
  EXPECT_DOUBLE_EQ(three.permute_bytes_per_s, 5e9);
  EXPECT_DOUBLE_EQ(three.kernel_forward_panel_s, 3e-6);
  EXPECT_DOUBLE_EQ(three.kernel_forward_key_s, 2e-8);

  // A causal problem is charged at the causal rates, a non-causal one at the plain rates.
  Problem problem;
  problem.seq = 4096;
  problem.heads = problem.kv_heads = 8;
  problem.head_dim = 64;
  Plan plan = default_plan(Algorithm::ring, problem, 4);
  const Prediction plain = predict(problem, plan, four, 4);
  EXPECT_DOUBLE_EQ(plain.forward_compute_s, plain.forward_flops / 20e9);
  EXPECT_DOUBLE_EQ(plain.backward_compute_s, plain.backward_flops / 15e9);
  problem.mask = Mask::causal();
  plan = default_plan(Algorithm::ring, problem, 4);
  const Prediction causal = predict(problem, plan, four, 4);
  EXPECT_DOUBLE_EQ(causal.forward_compute_s, causal.forward_flops / 10e9);
  EXPECT_DOUBLE_EQ(causal.backward_compute_s, causal.backward_flops / 5e9);

  // With the calibration block recorded, the CPU kernels' tiles are charged: a non-causal
  // problem whose calls are whole multiples of the tiles costs its FLOPs at the plain rates times
  // the calibration block's own padding, and a causal one at least its unmasked FLOPs.
  c.ranks = 2;
  c.block = 1024;
  save_calibration(file, c);
  const Machine tiled = local_machine(file, 2);
  EXPECT_EQ(tiled.tile_block, 1024);
  problem.mask = Mask::none();
  problem.seq = 2 * 4608;  // 4608 = 96 x 48: every call is whole tiles
  plan = default_plan(Algorithm::ring, problem, 2);
  const Prediction whole = predict(problem, plan, tiled, 2);
  EXPECT_NEAR(whole.backward_compute_s,
              whole.backward_flops / 15e9 / (1056.0 * 1056.0 / (1024.0 * 1024.0)),
              1e-9 * whole.backward_compute_s);
  problem.mask = Mask::causal();
  plan = default_plan(Algorithm::ring, problem, 2);
  const Prediction tiled_causal = predict(problem, plan, tiled, 2);
  EXPECT_GT(tiled_causal.backward_compute_s,
            tiled_causal.backward_flops / 15e9 / (1056.0 * 1056.0 / (1024.0 * 1024.0)));
}

// a2d bench --calibrate measures before and after its rows and predicts with the average: the
// mean of the two times for every term.
TEST(CostModel, CalibrationsAverageTheirTimes) {
  Calibration a, b;
  a.ranks = b.ranks = 4;
  a.kernel_forward_flops = 10e9;  // 1 s per 10 GFLOP
  b.kernel_forward_flops = 40e9;  // 0.25 s
  a.bytes_per_s = 1e9;
  b.bytes_per_s = 3e9;
  a.permute_bytes_per_s = 2e9;  // b: not measured
  a.merge_bytes_per_s = 1e9;
  b.merge_bytes_per_s = 4e9;
  a.latency_s = 10e-6;
  b.latency_s = 30e-6;
  a.sync_s = 0;
  b.sync_s = 2e-3;
  a.kernel_forward_panel_s = 1e-6;
  b.kernel_forward_panel_s = 3e-6;
  const Calibration c = average_calibrations(a, b);
  EXPECT_DOUBLE_EQ(10e9 / c.kernel_forward_flops, (1.0 + 0.25) / 2);
  EXPECT_DOUBLE_EQ(1 / c.bytes_per_s, (1 / 1e9 + 1 / 3e9) / 2);
  EXPECT_DOUBLE_EQ(c.permute_bytes_per_s, 2e9);
  EXPECT_DOUBLE_EQ(1 / c.merge_bytes_per_s, (1 / 1e9 + 1 / 4e9) / 2);
  EXPECT_DOUBLE_EQ(c.latency_s, 20e-6);
  EXPECT_DOUBLE_EQ(c.sync_s, 1e-3);
  EXPECT_DOUBLE_EQ(c.kernel_forward_panel_s, 2e-6);
  b.ranks = 8;
  EXPECT_THROW(average_calibrations(a, b), Error);
}

// a2d calibrate times the forward on calls of several shapes and fits what a call costs per
// score entry, per 24-row panel and per key: exact times give the costs back; a cost the times
// make negative is dropped and the rest refitted; times that cannot be fitted give none.
TEST(CostModel, ForwardCallCostsAreFittedFromTimedShapes) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{256, 256}, {256, 64}, {64, 256},
                                                           {256, 32},  {32, 256}, {64, 64}};
  const auto times = [&](double e, double p, double k) {
    std::vector<double> t;
    for (const auto& [rows, keys] : shapes) {
      std::vector<int64_t> q(static_cast<size_t>(rows)), kv(static_cast<size_t>(keys));
      std::iota(q.begin(), q.end(), int64_t{0});
      std::iota(kv.begin(), kv.end(), int64_t{0});
      t.push_back(e * forward_tile_entries(Mask::none(), q, kv) +
                  p * static_cast<double>((rows + 23) / 24) + k * static_cast<double>(keys));
    }
    return t;
  };
  const ForwardCallCosts exact = fit_forward_call_costs(shapes, times(3e-9, 1.5e-6, 2e-8));
  EXPECT_NEAR(exact.entry_s, 3e-9, 3e-9 * 1e-6);
  EXPECT_NEAR(exact.panel_s, 1.5e-6, 1.5e-6 * 1e-6);
  EXPECT_NEAR(exact.key_s, 2e-8, 2e-8 * 1e-6);
  // Keys that seem to save time: the key cost is dropped, entries and panels refitted.
  const ForwardCallCosts no_keys = fit_forward_call_costs(shapes, times(3e-9, 1.5e-6, -1e-9));
  EXPECT_EQ(no_keys.key_s, 0.0);
  EXPECT_GT(no_keys.entry_s, 0.0);
  EXPECT_GT(no_keys.panel_s, 0.0);
  // Calls that get faster with more work: nothing usable.
  const ForwardCallCosts none = fit_forward_call_costs(shapes, times(-1e-9, 1e-3, 1e-5));
  EXPECT_EQ(none.entry_s, 0.0);
  EXPECT_EQ(none.panel_s, 0.0);
  EXPECT_EQ(none.key_s, 0.0);
  EXPECT_THROW(fit_forward_call_costs(shapes, {1.0, 2.0}), Error);
}

TEST(CostModel, MachineFilesHoldEveryFieldAndFailLoudly) {
  const std::string file = ::testing::TempDir() + "/a2d-machine-test.txt";
  const auto write = [&](const std::string& text) {
    FILE* out = std::fopen(file.c_str(), "w");
    ASSERT_NE(out, nullptr);
    std::fputs(text.c_str(), out);
    std::fclose(out);
  };
  const std::string required =
      "device = cpu\nranks_per_node = 4\nshared_link = 1\nintra_latency_us = 2\n"
      "intra_bandwidth_gbs = 3\ninter_latency_us = 60   # a comment\n"
      "inter_bandwidth_gbs = 0.0125\nmemory_gib = 1.5\nkernel_forward_gflops = 5\n"
      "kernel_backward_gflops = 4\n";
  write("name = test-cluster\n" + required +
        "kernel_forward_causal_gflops = 3\nkernel_backward_causal_gflops = 2\nblock = 1024\n"
        "kernel_forward_panel_us = 1.5\nkernel_forward_key_us = 0.25\npermute_gbs = 6\n"
        "sum_gbs = 7\nmerge_gbs = 8\ncores = 2\nsync_us = 30\nstep_sync_us = 40\n"
        "cyclic_placement = 1\nkernel_forward_gflops_bf16 = 6\n");
  const Machine m = load_machine_file(file, DType::f32);
  EXPECT_EQ(m.name, "test-cluster");
  EXPECT_FALSE(m.gpu);
  EXPECT_FALSE(machine_file_is_gpu(file));
  EXPECT_EQ(m.ranks_per_node, 4);
  EXPECT_TRUE(m.shared_link);
  EXPECT_EQ(m.memory_bytes, int64_t{3} << 29);
  EXPECT_DOUBLE_EQ(m.intra.latency_s, 2e-6);
  EXPECT_DOUBLE_EQ(m.intra.bytes_per_s, 3e9);
  EXPECT_DOUBLE_EQ(m.inter.latency_s, 60e-6);
  EXPECT_DOUBLE_EQ(m.inter.bytes_per_s, 12.5e6);
  EXPECT_DOUBLE_EQ(m.kernel_forward_flops, 5e9);
  EXPECT_DOUBLE_EQ(m.kernel_backward_flops, 4e9);
  EXPECT_DOUBLE_EQ(m.kernel_forward_causal_flops, 3e9);
  EXPECT_DOUBLE_EQ(m.kernel_backward_causal_flops, 2e9);
  EXPECT_EQ(m.tile_block, 1024);
  EXPECT_DOUBLE_EQ(m.kernel_forward_panel_s, 1.5e-6);
  EXPECT_DOUBLE_EQ(m.kernel_forward_key_s, 0.25e-6);
  EXPECT_DOUBLE_EQ(m.permute_bytes_per_s, 6e9);
  EXPECT_DOUBLE_EQ(m.sum_bytes_per_s, 7e9);
  EXPECT_DOUBLE_EQ(m.merge_bytes_per_s, 8e9);
  EXPECT_EQ(m.shared_cores, 2);
  EXPECT_DOUBLE_EQ(m.sync_s, 30e-6);
  EXPECT_DOUBLE_EQ(m.step_sync_s, 40e-6);
  EXPECT_TRUE(m.cyclic_placement);
  // Kernel rates per dtype: a dtype's own key over the plain one (which serves every dtype on a
  // CPU machine).
  EXPECT_DOUBLE_EQ(load_machine_file(file, DType::bf16).kernel_forward_flops, 6e9);
  EXPECT_DOUBLE_EQ(load_machine_file(file, DType::bf16).kernel_backward_flops, 4e9);
  EXPECT_DOUBLE_EQ(load_machine_file(file, DType::f16).kernel_forward_flops, 5e9);

  // Every required key, in turn, missing: an error naming it.
  std::istringstream lines(required);
  for (std::string skip; std::getline(lines, skip);) {
    std::string text;
    std::istringstream again(required);
    for (std::string line; std::getline(again, line);)
      if (line != skip) text += line + "\n";
    write(text);
    const std::string key = skip.substr(0, skip.find(' '));
    EXPECT_NE(error_of([&] { load_machine_file(file, DType::f32); }).find("'" + key),
              std::string::npos)
        << "without: " << skip;
  }
  // A required key replaced by a bad value: the message names the line and says why.
  const auto with = [&](const std::string& key, const std::string& value) {
    std::string text;
    std::istringstream again(required);
    for (std::string line; std::getline(again, line);)
      text += (line.rfind(key + " ", 0) == 0 ? key + " = " + value : line) + "\n";
    write(text);
    return error_of([&] { load_machine_file(file, DType::f32); });
  };
  EXPECT_NE(with("ranks_per_node", "8.5").find(":2: 'ranks_per_node' needs a whole number"),
            std::string::npos);
  EXPECT_NE(with("ranks_per_node", "0").find("must be between 1"), std::string::npos);
  EXPECT_NE(with("shared_link", "2").find("'shared_link' must be between 0 and 1"),
            std::string::npos);
  EXPECT_NE(with("inter_bandwidth_gbs", "0").find("must be positive"), std::string::npos);
  EXPECT_NE(with("inter_latency_us", "-1").find("must be >= 0"), std::string::npos);
  EXPECT_NE(with("memory_gib", "lots").find("'memory_gib' needs a number"), std::string::npos);
  EXPECT_NE(with("device", "tpu").find("'device' is gpu or cpu"), std::string::npos);
  // Unknown keys, repeated keys, malformed lines.
  write(required + "inter_bandwidth = 1\n");
  EXPECT_NE(error_of([&] { load_machine_file(file, DType::f32); }).find("unknown key"),
            std::string::npos);
  write(required + "sum_gbs = fast\n");
  EXPECT_THROW(load_machine_file(file, DType::f32), Error);
  write(required + "cyclic_placement = 0.5\n");
  EXPECT_THROW(load_machine_file(file, DType::f32), Error);
  write(required + "shared_link = 0\n");
  EXPECT_NE(error_of([&] { load_machine_file(file, DType::f32); }).find("given twice"),
            std::string::npos);
  write(required + "no equals sign\n");
  EXPECT_THROW(load_machine_file(file, DType::f32), Error);

  // A GPU machine: rates per dtype only (a plain rate is refused), none of the CPU kernels'
  // terms, and a dtype without rates refused by name.
  std::string gpu = required;
  gpu.replace(gpu.find("device = cpu"), 12, "device = gpu");
  gpu.replace(gpu.find("kernel_forward_gflops = 5\nkernel_backward_gflops = 4\n"), 52,
              "kernel_forward_gflops_bf16 = 300\nkernel_backward_gflops_bf16 = 200\n");
  write(gpu);
  EXPECT_TRUE(machine_file_is_gpu(file));
  EXPECT_TRUE(load_machine_file(file, DType::bf16).gpu);
  EXPECT_DOUBLE_EQ(load_machine_file(file, DType::bf16).kernel_backward_flops, 200e9);
  EXPECT_NE(error_of([&] {
              load_machine_file(file, DType::f16);
            }).find("gives no 'kernel_forward_gflops_fp16'"),
            std::string::npos);
  write(gpu + "kernel_forward_gflops = 1\n");
  EXPECT_NE(error_of([&] { load_machine_file(file, DType::bf16); }).find("per dtype"),
            std::string::npos);
  write(gpu + "cores = 2\n");
  EXPECT_NE(error_of([&] { load_machine_file(file, DType::bf16); }).find("CPU kernels"),
            std::string::npos);
  std::remove(file.c_str());
  EXPECT_THROW(load_machine_file(file, DType::f32), Error);
}

}  // namespace
}  // namespace a2d
