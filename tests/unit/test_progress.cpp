// Long runs say so (attention2d/tools/progress.hpp): the prediction's line and its threshold, the
// progress line's format (phase, iteration, share done, elapsed, left), its cadence (never more
// often than every_s, not before after_s), and the estimated machine without a calibration.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "attention2d/cost_model.hpp"
#include "attention2d/peak.hpp"
#include "attention2d/timing.hpp"
#include "attention2d/tools/progress.hpp"

namespace a2d {
namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  return lines;
}

TEST(Progress, Durations) {
  EXPECT_EQ(duration_text(0.42), "0.4 s");
  EXPECT_EQ(duration_text(45), "45 s");
  EXPECT_EQ(duration_text(200), "3 min 20 s");
  EXPECT_EQ(duration_text(7500), "2 h 5 min");
  EXPECT_EQ(duration_text(2 * 86400 + 3 * 3600 + 60), "2 d 3 h");
  EXPECT_EQ(duration_text(-1), "?");
}

TEST(Progress, LineSaysPhaseIterationShareElapsedAndLeft) {
  ProgressSettings settings;
  Progress progress("a2d kernel", false, settings);
  progress.predict(100, "4 calls", "a test");
  progress.stage("setup", 0, 0, 0);
  EXPECT_EQ(progress.line(3), "a2d kernel: setup, 0.0% done, 3.0 s elapsed, ~1 min 40 s left\n");
  double done = 0.5;
  progress.stage("forward", 1, 4, 25, [&done] { return done; });
  // 12.5 % of the prediction done in the 10 s since the first predicted stage began.
  EXPECT_EQ(progress.line(10),
            "a2d kernel: forward, iteration 1 of 4, 12.5% done, 10 s elapsed, ~1 min 10 s left\n");
  done = 7;  // a counter past its stage's count is the whole stage, no more
  progress.stage(
      "forward", 2, 4, 25, [&done] { return done; }, [] { return std::string("forward.kernel"); });
  EXPECT_EQ(progress.line(40),
            "a2d kernel: forward.kernel, iteration 2 of 4, 50.0% done, 40 s elapsed, ~40 s left\n");
  // Without a prediction: the phase and the time elapsed.
  Progress unpredicted("a2d run", false, settings);
  unpredicted.stage("io", 0, 0, 0);
  EXPECT_EQ(unpredicted.line(31), "a2d run: io, 31 s elapsed\n");
}

TEST(Progress, PredictionOnlyAboveTheThreshold) {
  ProgressSettings settings;
  settings.predict_s = 10;
  settings.after_s = 30;
  settings.every_s = 10;
  testing::internal::CaptureStderr();
  {
    Progress progress("a2d run", true, settings);
    progress.predict(9, "a short run", "a test");
    progress.finish();
  }
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  testing::internal::CaptureStderr();
  {
    Progress progress("a2d run", true, settings);
    progress.predict(3600, "4 calls", "a test");
  }
  EXPECT_EQ(testing::internal::GetCapturedStderr(),
            "a2d run: predicted 1 h 0 min for 4 calls (a test); progress on stderr every 10 s "
            "after 30 s (--quiet: none)\n");
  testing::internal::CaptureStderr();
  {
    Progress quiet("a2d run", false, settings);
    quiet.predict(3600, "4 calls", "a test");
  }
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

TEST(Progress, CadenceNeverFasterThanEveryNorBeforeAfter) {
  ProgressSettings settings;
  settings.predict_s = 1e9;
  settings.after_s = 0.3;
  settings.every_s = 0.25;
  const double start = seconds_now();
  testing::internal::CaptureStderr();
  double ran = 0;
  {
    Progress progress("a2d kernel", true, settings);
    progress.predict(10, "a test", "a test");
    progress.stage("forward", 1, 1, 10, [&] { return (seconds_now() - start) / 10; });
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    ran = seconds_now() - start;
  }
  const std::vector<std::string> lines = lines_of(testing::internal::GetCapturedStderr());
  // At most one line at after_s and one every every_s after it; at least one (1.5 s > 0.3 s).
  const int most = 1 + static_cast<int>((ran - settings.after_s) / settings.every_s);
  EXPECT_GE(lines.size(), 1u);
  EXPECT_LE(static_cast<int>(lines.size()), most);
  const std::regex format(
      R"(a2d kernel: forward, iteration 1 of 1, [0-9]+\.[0-9]% done, [0-9.]+ s elapsed, ~[0-9.]+ s left)");
  for (const std::string& line : lines)
    EXPECT_TRUE(std::regex_match(line, format)) << line;
}

TEST(Progress, EstimatedMachineIsThePeakTimesTheEfficiency) {
  FmaPeak peak;
  peak.gflops = 100;
  peak.gflops_per_thread = 100;
  peak.threads = 1;
  peak.isa = "avx512-fma";
  const LocalMachine local = local_machine_for_prediction(1, 1, "/nonexistent/calibration", &peak);
  const KernelEfficiency efficiency = kernel_efficiency(peak);
  EXPECT_DOUBLE_EQ(local.machine.kernel_forward_flops, 100e9 * efficiency.forward);
  EXPECT_DOUBLE_EQ(local.machine.kernel_backward_flops, 100e9 * efficiency.backward);
  EXPECT_NE(local.source.find("an estimate: no calibration of 1 rank"), std::string::npos)
      << local.source;
  EXPECT_TRUE(could_take_longer(1e12, 1, 10));  // 500 s at 2 GFLOP/s
  EXPECT_FALSE(could_take_longer(1e9, 1, 10));
}

// A calibrated machine predicts with the problem's dtype: bf16 with the bf16 rates where the
// calibration has them (the amx and avx512bf16 paths'), every dtype with the fp32 ones otherwise.
TEST(Progress, CalibratedMachineTakesTheProblemsDtype) {
  const std::string file = ::testing::TempDir() + "/a2d-progress-calibration.txt";
  std::remove(file.c_str());
  Calibration c;
  c.ranks = 2;
  c.cores = 2;
  c.kernel_forward_flops = 100e9;
  c.kernel_backward_flops = 90e9;
  c.latency_s = 1e-6;
  c.bytes_per_s = 1e9;
  save_calibration(file, c);
  EXPECT_DOUBLE_EQ(
      local_machine_for_prediction(2, 1, file, nullptr, DType::bf16).machine.kernel_forward_flops,
      100e9);
  c.kernel_forward_flops_bf16 = 400e9;
  c.kernel_backward_flops_bf16 = 350e9;
  save_calibration(file, c);
  const LocalMachine bf16 = local_machine_for_prediction(2, 1, file, nullptr, DType::bf16);
  const LocalMachine fp32 = local_machine_for_prediction(2, 1, file);
  EXPECT_DOUBLE_EQ(bf16.machine.kernel_forward_flops, 400e9);
  EXPECT_DOUBLE_EQ(bf16.machine.kernel_backward_flops, 350e9);
  EXPECT_DOUBLE_EQ(fp32.machine.kernel_forward_flops, 100e9);
  std::remove(file.c_str());
}

}  // namespace
}  // namespace a2d
