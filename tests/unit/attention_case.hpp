// Test helper: one attention problem, run through the fp32 kernel and the fp64 reference, with
// the relative error of every output.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "attention2d/kernel.hpp"
#include "backends/cpu/kernels/cpu_kernels.hpp"

namespace a2d::test {

// How the global positions of query and key rows are laid out.
enum class Positions {
  contiguous,  // 0, 1, 2, ... (nullptr)
  strided,     // queries 3 + 4i, keys 1 + 4j (like one rank of a cyclic layout)
  arbitrary,   // increasing with random gaps, queries and keys interleaved
  shuffled,    // arbitrary, then shuffled: no order at all
};

struct Case {
  int64_t batch = 1;
  int64_t heads = 1;
  int64_t kv_heads = 1;
  int64_t q_tokens = 64;
  int64_t kv_tokens = 64;
  int64_t head_dim = 64;
  Mask mask;
  Positions positions = Positions::contiguous;
  int threads = 1;
  float amplitude = 1.0f;  // scales Q and K: larger values make the softmax peakier
  float scale = 0.0f;      // 0: 1/sqrt(head_dim)
  float softcap = 0.0f;    // 0: off
  bool sinks = false;      // attention sinks (generate_sinks of the seed), added by add_sinks
  uint64_t seed = 7;
  // Non-finite inputs (-1: none): a NaN in Q row `nan_q_row` (batch 0, head 0, dim 1), +Inf in
  // K row `inf_k_row` and a NaN in V row `nan_v_row` (batch 0, K/V head 0, dim 0).
  int64_t nan_q_row = -1;
  int64_t inf_k_row = -1;
  int64_t nan_v_row = -1;

  std::string name() const;
};
std::ostream& operator<<(std::ostream& out, const Case& c);

struct Errors {
  double out = 0, lse = 0, dq = 0, dk = 0, dv = 0, dsink = 0;  // dsink: 0 without sinks
};

// Generated inputs and positions of a case.
struct Problem {
  AttentionShape shape;
  std::vector<float> q, k, v, d_out;
  std::vector<int64_t> q_positions, kv_positions;  // empty = contiguous
  std::vector<float> sinks;                        // [heads] with Case::sinks
  float scale = 0;

  const int64_t* q_pos() const { return q_positions.empty() ? nullptr : q_positions.data(); }
  const int64_t* kv_pos() const { return kv_positions.empty() ? nullptr : kv_positions.data(); }
};
Problem make_problem(const Case& c);

// Runs forward (and backward when asked) in fp32 and fp64 and compares, on the current path.
Errors run_case(const Case& c, bool backward);

// The same on every kernel path this CPU supports (the fp64 reference computed once).
struct PathErrors {
  KernelPath path;
  Errors errors;
};
std::vector<PathErrors> run_case_on_paths(const Case& c, bool backward);

// Every kernel path of fp32 inputs this build and CPU can run: portable, and avx2 and avx512
// where available. (The avx512bf16 and amx paths run fp32 inputs on the avx512 kernels:
// bf16_paths adds them.)
std::vector<KernelPath> supported_paths();
// supported_paths() and avx512bf16 and amx where available: the paths that differ on bf16 inputs.
std::vector<KernelPath> bf16_paths();

// Selects a kernel path for the lifetime of the object and restores the previous one after.
class PathScope {
 public:
  explicit PathScope(KernelPath path) : previous_(kernel_path()) { set_kernel_path(path); }
  ~PathScope() { set_kernel_path(previous_); }
  PathScope(const PathScope&) = delete;
  PathScope& operator=(const PathScope&) = delete;

 private:
  KernelPath previous_;
};

}  // namespace a2d::test
