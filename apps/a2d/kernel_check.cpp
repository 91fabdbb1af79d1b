// a2d kernel, the check (kernel_command.hpp): every output of the run against the fp64
// reference on the same inputs (the rounded values, widened).
#include <atomic>

#include "attention2d/reference.hpp"
#include "attention2d/tools/check.hpp"
#include "attention2d/watchdog.hpp"
#include "backends/cpu/kernels/cpu_kernels.hpp"
#include "kernel_command.hpp"

namespace a2d::commands::kernel_cmd {
namespace {

// Rows of the fp64 reference computed so far (its progress callback), for the progress lines.
std::atomic<int64_t> g_reference_rows{0};
void count_reference_row() {
  g_reference_rows.fetch_add(1, std::memory_order_relaxed);
}

std::vector<double> widen(const Tensor& x) {
  return {x.begin(), x.end()};
}

double error_of(const float* values, const double* reference, size_t count) {
  return relative_error(values, reference, static_cast<int64_t>(count));
}

}  // namespace

KernelCheck check_kernels(const KernelOptions& o, const KernelSetup& setup,
                          const BackendCapabilities& capabilities, const KernelEstimate& estimate,
                          const KernelRun& run, Progress& progress) {
  // Bounds (check.hpp): fp32 outputs kFp32RelativeBound; a 16-bit O its dtype's rounding bound;
  // dQ and dK, whose delta comes from that O, the delta-gradient bound of the dtype. Kernels that
  // round as tensor cores do (a GPU's): the tensor-core bounds (P and dS rounded to the dtype too).
  // The CPU's amx and avx512bf16 paths round P and dS as tensor cores do (bf16 only).
  const DType dtype = setup.dtype;
  const bool tensor_cores = capabilities.tensor_core_rounding;
  const bool rounds_p = tensor_cores || (setup.cpu_kernels && dtype == DType::bf16 &&
                                         bf16_kernels_round_like_tensor_cores());
  const double output_bound =
      dtype == DType::bf16  ? (rounds_p ? kTensorCoreBf16OutputBound : kBf16OutputBound)
      : dtype == DType::f16 ? (tensor_cores ? kTensorCoreF16OutputBound : kF16OutputBound)
                            : kFp32RelativeBound;
  const double delta_gradient_bound =
      dtype == DType::bf16
          ? (rounds_p ? kTensorCoreBf16DeltaGradientBound : kBf16DeltaGradientBound)
      : dtype == DType::f16
          ? (tensor_cores ? kTensorCoreF16DeltaGradientBound : kF16DeltaGradientBound)
          : kFp32RelativeBound;
  const double value_gradient_bound = !rounds_p              ? kFp32RelativeBound
                                      : dtype == DType::bf16 ? kTensorCoreBf16ValueGradientBound
                                                             : kTensorCoreF16ValueGradientBound;
  KernelCheck check;
  // The reference's rows: B H N query rows forward; backward again, and B Hkv Nkv key rows.
  const double rows = static_cast<double>(o.batch * o.heads * o.seq) * (o.backward ? 2.0 : 1.0) +
                      (o.backward ? static_cast<double>(o.batch * o.kv_heads * o.kv_seq) : 0.0);
  g_reference_rows = 0;
  progress.stage("check: the fp64 reference", 0, 0, estimate.check_s,
                 [rows] { return static_cast<double>(g_reference_rows.load()) / rows; });
  Watchdog::note_phase("check");
  const std::vector<double> q64 = widen(run.q.wide), k64 = widen(run.k.wide),
                            v64 = widen(run.v.wide);
  const std::vector<double> sinks64(run.sinks.begin(), run.sinks.end());
  reference::Inputs in{setup.shape,
                       setup.mask,
                       static_cast<double>(setup.scale),
                       q64.data(),
                       k64.data(),
                       v64.data(),
                       run.q_positions.empty() ? nullptr : run.q_positions.data(),
                       run.kv_positions.empty() ? nullptr : run.kv_positions.data(),
                       static_cast<int>(o.threads)};
  in.softcap = o.softcap;
  in.sinks = o.sinks ? sinks64.data() : nullptr;
  in.progress = &count_reference_row;
  std::vector<double> out64(run.q.size()), lse64(run.lse.size());
  reference::forward(in, out64.data(), lse64.data());
  const std::vector<float> out32 = run.out.floats();
  check.forward = {
      {"O", "o", error_of(out32.data(), out64.data(), out32.size()), output_bound},
      {"LSE", "lse", error_of(run.lse.data(), lse64.data(), run.lse.size()), kFp32RelativeBound}};
  if (o.parts > 1) {
    const std::vector<float> merged32 = run.out_merged.floats();
    check.forward.push_back({"O(merge)", "o_merge",
                             error_of(merged32.data(), out64.data(), merged32.size()),
                             output_bound});
    check.forward.push_back({"LSE(merge)", "lse_merge",
                             error_of(run.lse_merged.data(), lse64.data(), run.lse_merged.size()),
                             kFp32RelativeBound});
  }
  if (o.backward) {
    const std::vector<double> do64 = widen(run.d_out->wide);
    std::vector<double> dq64(run.q.size()), dk64(run.k.size()), dv64(run.v.size());
    std::vector<double> dsink64(static_cast<size_t>(o.heads));
    // The exact delta, as for dQ and dK (dsink, like them, has the delta-gradient bound).
    reference::backward(in, do64.data(), dq64.data(), dk64.data(), dv64.data(), nullptr,
                        dsink64.data());
    check.backward = {
        {"dQ", "dq", error_of(run.dq.data(), dq64.data(), run.dq.size()), delta_gradient_bound},
        {"dK", "dk", error_of(run.dk.data(), dk64.data(), run.dk.size()), delta_gradient_bound},
        {"dV", "dv", error_of(run.dv.data(), dv64.data(), run.dv.size()), value_gradient_bound}};
    if (o.sinks) {
      check.backward.push_back({"dsink", "dsink",
                                relative_error(run.dsink.data(), dsink64.data(), o.heads),
                                delta_gradient_bound});
    }
  }
  for (const auto* errors : {&check.forward, &check.backward}) {
    for (const CheckError& e : *errors)
      check.pass = check.pass && e.value <= e.bound;
  }
  return check;
}

}  // namespace a2d::commands::kernel_cmd
