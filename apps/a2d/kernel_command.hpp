// Internal: the pieces of `a2d kernel` (kernel_command.cpp). The options and their validation
// live there; the run through the backend in kernel_run.cpp; the check against the fp64
// reference in kernel_check.cpp; the table or JSON lines in kernel_report.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attention2d/backend.hpp"
#include "attention2d/dtype.hpp"
#include "attention2d/kernel.hpp"
#include "attention2d/peak.hpp"
#include "attention2d/timing.hpp"
#include "attention2d/tools/progress.hpp"
#include "backends/cpu/kernels/cpu_kernels.hpp"

namespace a2d::commands::kernel_cmd {

struct KernelOptions {
  int64_t seq = 1024;
  int64_t kv_seq = 0;  // 0: same as seq
  int64_t heads = 8;
  int64_t kv_heads = 0;  // 0: same as heads
  int64_t head_dim = 64;
  int64_t batch = 1;
  int64_t window = 0;
  int64_t threads = 1;
  int64_t seed = 42;
  int64_t shuffle = 0;  // 0: positions 0, 1, 2, ...; else the seed of shuffled positions
  int64_t warmup = 1;
  int64_t repeats = 5;
  int64_t parts = 1;   // > 1: the keys in this many parts, through the partial/merge operations
  double scale = 0.0;  // 0: 1/sqrt(head_dim)
  bool causal = false;
  std::string window_size;  // --window-size LEFT,RIGHT; "" = none
  std::string doc_lens;     // "" = one document
  std::string mask_ranges;  // --mask-ranges; "" = none
  bool sinks = false;
  double softcap = 0.0;
  bool backward = false;
  bool check = false;
  bool json = false;
  bool huge_pages = false;
  bool no_memory_check = false;
  bool quiet = false;
  std::string path;    // empty: A2D_KERNEL_PATH, else auto
  std::string device;  // empty: default_device(dtype)
  std::string dtype;   // "": the device's first dtype (bf16 on cuda and fenced-cuda), else fp32
};

// What the options resolve to.
struct KernelSetup {
  DType dtype = DType::f32;
  std::string device;
  KernelPath path = KernelPath::portable;
  AttentionShape shape;
  Mask mask;
  float scale = 0.0f;
  // The backend's kernels are the CPU's: the FMA peak, the kernel path and the estimate apply.
  bool cpu_kernels = true;
};

// The predicted seconds of each call (0 where there is no estimate: not the CPU's kernels) and
// the score entries one call computes (what the progress lines count).
struct KernelEstimate {
  double forward_s = 0;
  double backward_s = 0;
  double check_s = 0;
  double call_entries = 0;
};

// Host memory of the command's tensors: with --huge-pages each is a 2 MiB-aligned block advised
// as transparent huge pages (Linux madvise), so that an experiment can show what the TLB misses
// of rows that lie one page apart cost the kernel (docs/performance.md).
void use_huge_pages(bool on);
template <typename T>
struct TensorAllocator {
  using value_type = T;
  TensorAllocator() = default;
  template <typename U>
  TensorAllocator(const TensorAllocator<U>&) {}
  T* allocate(std::size_t count);
  void deallocate(T* memory, std::size_t);
  template <typename U>
  bool operator==(const TensorAllocator<U>&) const {
    return true;
  }
};
using Tensor = std::vector<float, TensorAllocator<float>>;
using Tensor16 = std::vector<uint16_t, TensorAllocator<uint16_t>>;  // bf16 or fp16 elements

// A tensor of `dtype`: fp32 values in `wide`; for bf16 and fp16 the stored elements in `stored`
// and, in `wide`, the same values widened (what the fp64 reference reads).
struct TypedTensor {
  DType dtype = DType::f32;
  Tensor wide;
  Tensor16 stored;

  TypedTensor() = default;
  // Generated values rounded to `dtype`.
  TypedTensor(DType dtype, const std::vector<float>& values);
  // An output of `count` elements.
  TypedTensor(DType dtype, size_t count);
  size_t size() const { return dtype == DType::f32 ? wide.size() : stored.size(); }
  int64_t bytes() const { return static_cast<int64_t>(size()) * dtype_bytes(dtype); }
  void* data();
  const void* data() const;
  // The values as fp32 (an output's, widened).
  std::vector<float> floats() const;
};

// What a run produced: the inputs (for the reference), the outputs, the timings.
struct KernelRun {
  TypedTensor q, k, v;
  std::optional<TypedTensor> d_out;
  std::vector<int64_t> q_positions, kv_positions;  // empty: in order
  std::vector<float> sinks;                        // empty without --sinks
  TypedTensor out, out_merged;                     // out_merged: --parts, through records
  Tensor lse, lse_merged;
  Tensor dq, dk, dv;
  std::vector<float> dsink;
  double generate_seconds = 0;
  double forward_flops = 0;  // unmasked work of one forward call
  Summary forward_ms, forward_cpu_ms, backward_ms, backward_cpu_ms;
  int64_t forward_workspace = 0, backward_workspace = 0;
  std::optional<int64_t> forward_rss_growth, backward_rss_growth;
};

// Generates the inputs and times the kernels on `backend`: buffers over the host tensors where
// the backend wraps host memory (the CPU's), else uploaded once and the outputs downloaded.
KernelRun run_kernels(const KernelOptions& o, const KernelSetup& setup,
                      const KernelEstimate& estimate, Backend& backend, Progress& progress);

// One output's error against the fp64 reference.
struct CheckError {
  const char* name;  // table column; the JSON keys are "err_" and "bound_" + `key`
  const char* key;
  double value;
  double bound;
};
struct KernelCheck {
  std::vector<CheckError> forward, backward;
  bool pass = true;
};
// Every output of the run against the fp64 reference on the same (rounded) inputs.
KernelCheck check_kernels(const KernelOptions& o, const KernelSetup& setup,
                          const BackendCapabilities& capabilities, const KernelEstimate& estimate,
                          const KernelRun& run, Progress& progress);

// The table (or JSON lines) of the run and the check's verdict line.
void report_kernels(const KernelOptions& o, const KernelSetup& setup, const FmaPeak& peak,
                    const KernelRun& run, const KernelCheck& check);

}  // namespace a2d::commands::kernel_cmd
