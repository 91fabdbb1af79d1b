// The simulated device (sim.hpp) without a simulator: a recording runtime stands for SimGrid's
// clock. The per-call kernel time (kernel_call_seconds) is predict()'s compute on one rank; the
// backend charges every operation what sim.hpp says and nothing else, keeps uploaded positions,
// refuses to read values it does not hold, never overlaps one rank's buffers, and, as a GPU,
// refuses what the CUDA kernels refuse. The simulation itself runs in CTest as sim.smpi_p16
// (sim/CMakeLists.txt).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "attention2d/attention.hpp"
#include "attention2d/cost_model.hpp"
#include "attention2d/error.hpp"
#include "attention2d/sim.hpp"

namespace a2d {
namespace {

class RecordingRuntime final : public SimRuntime {
 public:
  void compute(double seconds) override { clock += seconds; }
  std::byte* placeholder_region(int64_t bytes) override {
    memory.resize(static_cast<size_t>(std::max<int64_t>(bytes, 1)));
    return memory.data();
  }
  double clock = 0;
  std::vector<std::byte> memory;
};

std::vector<int64_t> iota(int64_t n, int64_t first = 0, int64_t step = 1) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] = first + i * step;
  return v;
}

// A CPU machine as a calibration describes it (tile replay, per-panel and per-key costs).
Machine cpu_machine() {
  Machine m;
  m.name = "cpu-test";
  m.kernel_forward_flops = 40e9;
  m.kernel_backward_flops = 30e9;
  m.tile_block = 1024;
  m.kernel_forward_panel_s = 2e-6;
  m.kernel_forward_key_s = 1e-8;
  return m;
}

Problem one_rank_problem(int64_t seq, const Mask& mask) {
  Problem p;
  p.heads = 4;
  p.kv_heads = 2;
  p.seq = seq;
  p.head_dim = 64;
  p.mask = mask;
  p.dtype = DType::bf16;
  return p;
}

// On one rank ATTENTION2D makes one kernel call over the whole sequence, so its per-call time is
// the whole of predict()'s compute: the same rules, on every kind of machine and mask.
TEST(SimKernelTime, OneCallIsPredictsComputeOnOneRank) {
  for (const Machine& machine : {preset_machine("a100-hdr", DType::bf16),
                                 preset_machine("h100-ndr", DType::bf16), cpu_machine()}) {
    for (const Mask& mask : {Mask::none(), Mask::causal(), Mask::causal_window(300)}) {
      const Problem p = one_rank_problem(1537, mask);
      const Plan plan = default_plan(Algorithm::attention2d, p, 1);
      const Prediction prediction = predict(p, plan, machine, 1);
      const std::vector<int64_t> positions = iota(p.seq);
      KernelCall call;
      call.mask = mask;
      call.heads = p.heads;
      call.head_dim = p.head_dim;
      call.q_tokens = call.kv_tokens = p.seq;
      call.q_positions = positions;
      call.kv_positions = positions;
      EXPECT_NEAR(kernel_call_seconds(machine, call), prediction.forward_compute_s,
                  1e-9 * prediction.forward_compute_s)
          << machine.name << " " << mask.describe();
      call.backward = true;
      EXPECT_NEAR(kernel_call_seconds(machine, call), prediction.backward_compute_s,
                  1e-9 * prediction.backward_compute_s)
          << machine.name << " " << mask.describe();
    }
  }
}

// Accelerators count visible pairs: a causal call over strided positions, by hand.
TEST(SimKernelTime, CountsTheVisiblePairsOfTheCallsPositions) {
  const Machine machine = preset_machine("h100-ndr", DType::bf16);
  const std::vector<int64_t> q = iota(100, 3, 4);  // 3, 7, ..., 399
  const std::vector<int64_t> k = iota(200, 0, 2);  // 0, 2, ..., 398
  int64_t pairs = 0;
  for (int64_t a : q)
    for (int64_t b : k)
      pairs += b <= a ? 1 : 0;
  KernelCall call;
  call.mask = Mask::causal();
  call.batch = 2;
  call.heads = 3;
  call.head_dim = 128;
  call.q_tokens = 100;
  call.kv_tokens = 200;
  call.q_positions = q;
  call.kv_positions = k;
  const double expected =
      2.0 * 3 * 4 * 128 * static_cast<double>(pairs) / machine.kernel_forward_flops;
  EXPECT_NEAR(kernel_call_seconds(machine, call), expected, 1e-12 * expected);
  // The same rows in another order: the same pairs.
  std::vector<int64_t> shuffled = k;
  std::reverse(shuffled.begin(), shuffled.end());
  call.kv_positions = shuffled;
  EXPECT_NEAR(kernel_call_seconds(machine, call), expected, 1e-12 * expected);
  call.q_tokens = 0;
  call.q_positions = {};
  EXPECT_EQ(kernel_call_seconds(machine, call), 0.0);
  call.q_tokens = 5;  // positions that do not match the count
  call.q_positions = q;
  EXPECT_THROW(kernel_call_seconds(machine, call), Error);
}

// The closed forms per pair of runs against counting position by position and against the mask's
// own rule pair by pair (MaskView::visible, what the kernels apply), on random runs: ascending,
// descending, single positions, repeated positions, overlapping, under every mask kind (none,
// causal, causal windows, two-sided windows, ranges).
TEST(SimKernelTime, PairsOfRunsEqualPairsOfPositions) {
  uint64_t state = 12345;
  const auto next = [&](int64_t bound) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<int64_t>((state >> 33) % static_cast<uint64_t>(bound));
  };
  const auto random_runs = [&] {
    std::vector<PositionRun> runs(static_cast<size_t>(1 + next(4)));
    for (PositionRun& r : runs)
      r = {next(200), next(9) - 4, 1 + next(40)};
    return runs;
  };
  const auto expand = [](const std::vector<PositionRun>& runs) {
    std::vector<int64_t> out;
    for (const PositionRun& r : runs)
      for (int64_t i = 0; i < r.count; ++i)
        out.push_back(r.first + i * r.step);
    return out;
  };
  for (int trial = 0; trial < 400; ++trial) {
    const std::vector<PositionRun> q = random_runs(), k = random_runs();
    const std::vector<int64_t> qp = expand(q), kp = expand(k);
    for (const Mask& mask :
         {Mask::none(), Mask::causal(), Mask::causal_window(1), Mask::causal_window(37),
          Mask::window_size(5, 3), Mask::window_size(40, 0), Mask::window_size(0, 12),
          Mask::from_ranges({{0, 120, 0, 120, RangeType::causal},
                             {120, 250, 60, 250, RangeType::bi_causal},
                             {30, 90, 150, 240, RangeType::inv_causal}})}) {
      const MaskView view = mask.view();
      int64_t by_rule = 0;
      for (const int64_t a : qp)
        for (const int64_t b : kp)
          by_rule += view.visible(a, b) ? 1 : 0;
      ASSERT_EQ(count_visible_pairs(mask, q, k), by_rule)
          << "trial " << trial << " " << mask.describe();
      ASSERT_EQ(count_visible_pairs(mask, qp.data(), static_cast<int64_t>(qp.size()), kp.data(),
                                    static_cast<int64_t>(kp.size())),
                by_rule)
          << "trial " << trial << " " << mask.describe();
    }
    // Encoding positions as runs gives them back.
    EXPECT_EQ(expand(position_runs(qp)), qp);
  }
  // A sorted gather of 4 cyclic parts of 1000 tokens is one run; a zigzag shard two.
  EXPECT_EQ(position_runs(iota(250, 3, 4)).size(), 1u);
  std::vector<int64_t> zigzag = iota(64, 128);
  const std::vector<int64_t> mirror = iota(64, 1792);
  zigzag.insert(zigzag.end(), mirror.begin(), mirror.end());
  EXPECT_EQ(position_runs(zigzag).size(), 2u);
}

SimDevice gpu_device() {
  SimDevice device;
  device.machine = preset_machine("h100-ndr", DType::bf16);
  device.memory_bytes_per_s = 2e12;
  device.cuda_rules = true;
  device.pool_bytes = int64_t{1} << 24;
  return device;
}

TEST(SimBackend, ChargesKernelsByTheirPositionsAndDataByTheirBytes) {
  RecordingRuntime runtime;
  const SimDevice device = gpu_device();
  auto backend = make_sim_backend(device, runtime);
  auto phase = std::make_shared<std::string>("forward.kernel");
  backend->attribute_to(phase);
  EXPECT_EQ(backend->name(), "sim");
  EXPECT_TRUE(backend->host_accessible());

  const int64_t n = 256, heads = 2, dim = 64;
  BufferPtr q = backend->allocate(n * heads * dim * 2);
  BufferPtr k = backend->allocate(n * heads * dim * 2);
  BufferPtr v = backend->allocate(n * heads * dim * 2);
  BufferPtr out = backend->allocate(n * heads * dim * 2);
  BufferPtr lse = backend->allocate(n * heads * 4);
  const std::vector<int64_t> q_positions = iota(n, 1, 2), kv_positions = iota(n, 0, 2);
  BufferPtr q_at = upload_indices(*backend, q_positions);
  BufferPtr kv_at = upload_indices(*backend, kv_positions);
  EXPECT_EQ(runtime.clock, 0.0);  // uploads are not charged

  ForwardCall call;
  call.shape = {1, heads, heads, n, n, dim};
  call.mask = Mask::causal();
  call.scale = default_scale(dim);
  call.q = dense_token_tensor(*q, DType::bf16, n, heads, dim);
  call.k = dense_token_tensor(*k, DType::bf16, n, heads, dim);
  call.v = dense_token_tensor(*v, DType::bf16, n, heads, dim);
  call.q_positions = Place::in(*q_at);
  call.kv_positions = Place::in(*kv_at);
  backend->attention_forward(call, dense_token_tensor(*out, DType::bf16, n, heads, dim),
                             dense_row_tensor(*lse, heads, n));
  KernelCall expected_call;
  expected_call.mask = Mask::causal();
  expected_call.heads = heads;
  expected_call.head_dim = dim;
  expected_call.q_tokens = expected_call.kv_tokens = n;
  expected_call.q_positions = q_positions;
  expected_call.kv_positions = kv_positions;
  const double kernel = kernel_call_seconds(device.machine, expected_call);
  EXPECT_NEAR(runtime.clock, kernel, 1e-15);
  EXPECT_EQ(backend->charges().kernel_calls, 1);

  *phase = "forward.merge";
  backend->copy_bytes(Place::in(*q), Place::in(*k), 1000);        // 1000 read, 1000 written
  backend->merge_partials(Place::in(*q), Place::in(*k), 10, 66);  // 2 read, 1 written
  const double data = (2000.0 + 3 * 4 * 10 * 66) / device.memory_bytes_per_s;
  EXPECT_NEAR(runtime.clock, kernel + data, 1e-15);
  EXPECT_NEAR(backend->charges().by_phase.at("forward.kernel").kernel_s, kernel, 1e-15);
  EXPECT_NEAR(backend->charges().by_phase.at("forward.merge").data_s, data, 1e-15);

  // What was uploaded can be read back; nothing else holds values.
  std::vector<int64_t> back(n);
  backend->download(Place::in(*q_at), back.data(), n * 8);
  EXPECT_EQ(back, q_positions);
  EXPECT_THROW(backend->download(Place::in(*out), back.data(), 8), Error);
  // Kept as runs (one here), read back in part, and overwritten in part.
  backend->download(Place::in(*q_at) + 8 * 10, back.data(), 8 * 5);
  EXPECT_EQ(std::vector<int64_t>(back.begin(), back.begin() + 5),
            std::vector<int64_t>(q_positions.begin() + 10, q_positions.begin() + 15));
  const int64_t seven = 7;
  backend->upload(&seven, Place::in(*q_at) + 8 * 3, 8);
  backend->download(Place::in(*q_at), back.data(), n * 8);
  std::vector<int64_t> changed = q_positions;
  changed[3] = 7;
  EXPECT_EQ(back, changed);
  call.q_positions = Place::in(*q);  // positions nobody uploaded
  EXPECT_THROW(
      backend->attention_forward(call, dense_token_tensor(*out, DType::bf16, n, heads, dim),
                                 dense_row_tensor(*lse, heads, n)),
      Error);
}

TEST(SimBackend, KeepsOneRanksBuffersApartAndCountsItsPeak) {
  RecordingRuntime runtime;
  auto backend = make_sim_backend(gpu_device(), runtime);
  std::vector<BufferPtr> buffers;
  for (int64_t bytes : {1, 300, 4096, 255, 100000})
    buffers.push_back(backend->allocate(bytes));
  const int64_t peak = backend->charges().peak_bytes;
  EXPECT_EQ(peak, 256 + 512 + 4096 + 256 + 100096);
  buffers.erase(buffers.begin() + 2);  // a hole, reused first-fit
  buffers.push_back(backend->allocate(1000));
  std::vector<std::pair<uintptr_t, uintptr_t>> spans;
  for (const BufferPtr& b : buffers) {
    const auto start = reinterpret_cast<uintptr_t>(b->host_data());
    spans.emplace_back(start, start + static_cast<uintptr_t>(b->bytes()));
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    EXPECT_LE(spans[i - 1].second, spans[i].first);
  EXPECT_EQ(backend->charges().peak_bytes, peak);
  // The pool (16 MiB here) runs out with a clear error.
  EXPECT_THROW(backend->allocate(int64_t{1} << 25), Error);
}

TEST(SimBackend, AsAGpuRefusesWhatTheCudaKernelsRefuse) {
  RecordingRuntime runtime;
  auto gpu = make_sim_backend(gpu_device(), runtime);
  EXPECT_THROW(gpu->check_supported(DType::f32, 64, Mask::none(), 0.0f), Error);
  EXPECT_THROW(gpu->check_supported(DType::bf16, 72, Mask::none(), 0.0f), Error);
  EXPECT_NO_THROW(gpu->check_supported(DType::bf16, 128, Mask::causal(), 0.0f));
  SimDevice cpu = gpu_device();
  cpu.cuda_rules = false;
  cpu.machine = cpu_machine();
  auto host = make_sim_backend(cpu, runtime);
  EXPECT_NO_THROW(host->check_supported(DType::f32, 72, Mask::none(), 0.0f));
  SimDevice no_rates = cpu;
  no_rates.machine.kernel_forward_flops = 0;
  EXPECT_THROW(make_sim_backend(no_rates, runtime), Error);
}

}  // namespace
}  // namespace a2d
