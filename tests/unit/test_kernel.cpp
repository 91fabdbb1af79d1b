// The fp32 CPU kernels against the fp64 reference: O, LSE, dQ, dK, dV separately, each within
// kFp32RelativeBound (relative Frobenius error), over sequence lengths, head dims, head ratios
// (MHA, GQA, MQA), masks, position layouts, Nq != Nk, batch > 1 and thread counts, on every
// kernel path (portable and AVX2/FMA).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "attention2d/tools/check.hpp"
#include "attention_case.hpp"
#include "backends/cpu/kernels/cpu_kernels.hpp"

namespace a2d::test {
namespace {

std::vector<Mask> all_masks(int64_t window) {
  return {Mask::none(), Mask::causal(), Mask::causal_window(window)};
}

std::vector<Case> kernel_cases() {
  std::vector<Case> cases;
  // Head ratios 1:1, 8:8, 12:4 (GQA), 8:1 (MQA) x every mask; 150 rows cut tiles raggedly.
  for (const auto& [h, hkv] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {8, 8}, {12, 4}, {8, 1}}) {
    for (const Mask& m : all_masks(17)) {
      Case c;
      c.batch = 2;
      c.heads = h;
      c.kv_heads = hkv;
      c.q_tokens = c.kv_tokens = 150;
      c.head_dim = 64;
      c.mask = m;
      cases.push_back(c);
    }
  }
  // Head dims, including 80 and 96 (not powers of two) and 256.
  for (const int64_t d : {32, 64, 80, 96, 128, 256}) {
    for (const Mask& m : all_masks(33)) {
      Case c;
      c.heads = 2;
      c.kv_heads = 1;
      c.q_tokens = c.kv_tokens = 100;
      c.head_dim = d;
      c.mask = m;
      cases.push_back(c);
    }
  }
  // Sequence lengths 1, 7, 64, 1000, 4096.
  for (const int64_t n : {1, 7, 64, 1000, 4096}) {
    for (const Mask& m : all_masks(n >= 1000 ? 300 : 3)) {
      Case c;
      c.heads = n >= 4096 ? 1 : 4;
      c.kv_heads = n >= 4096 ? 1 : 2;
      c.q_tokens = c.kv_tokens = n;
      c.head_dim = n >= 4096 ? 32 : 64;
      c.mask = m;
      cases.push_back(c);
    }
  }
  // Strided, arbitrary and unordered positions; Nq != Nk both ways; GQA 12:4 at D = 80.
  for (const Positions p : {Positions::strided, Positions::arbitrary, Positions::shuffled}) {
    for (const Mask& m : all_masks(40)) {
      for (const auto& [nq, nk] : std::vector<std::pair<int64_t, int64_t>>{{300, 200}, {70, 333}}) {
        Case c;
        c.heads = 12;
        c.kv_heads = 4;
        c.q_tokens = nq;
        c.kv_tokens = nk;
        c.head_dim = 80;
        c.mask = m;
        c.positions = p;
        cases.push_back(c);
      }
    }
  }
  // Contiguous Nq != Nk, batch 3, two threads, peaky softmax (large scores), custom scale.
  for (const Mask& m : all_masks(25)) {
    Case c;
    c.batch = 3;
    c.heads = 6;
    c.kv_heads = 2;
    c.q_tokens = 333;
    c.kv_tokens = 130;
    c.head_dim = 96;
    c.mask = m;
    c.threads = 2;
    cases.push_back(c);
    c.amplitude = 3.0f;
    c.threads = 1;
    cases.push_back(c);
    c.amplitude = 1.0f;
    c.scale = 0.5f;
    c.q_tokens = 97;
    c.positions = Positions::arbitrary;
    cases.push_back(c);
  }
  return cases;
}

// Non-finite inputs: the kernel's poisoned entries must be exactly the reference's (relative_error
// requires matching non-finite entries), with key and value rows inside partial (diagonal) tiles
// and inside tiles the mask hides, for every mask and layout of positions.
std::vector<Case> nonfinite_cases() {
  std::vector<Case> cases;
  for (const Mask& m : all_masks(37)) {
    for (const Positions p : {Positions::contiguous, Positions::arbitrary}) {
      Case c;
      c.heads = 4;
      c.kv_heads = 2;
      c.q_tokens = c.kv_tokens = 150;
      c.head_dim = 64;
      c.mask = m;
      c.positions = p;
      c.nan_q_row = 70;
      c.inf_k_row = 100;
      c.nan_v_row = 90;
      cases.push_back(c);
      c.threads = 2;
      c.nan_q_row = -1;
      c.inf_k_row = 3;
      c.nan_v_row = 129;
      cases.push_back(c);
    }
  }
  return cases;
}

class KernelTest : public ::testing::TestWithParam<Case> {};

// Every case runs on every kernel path the CPU supports (portable, avx2, avx512), against one fp64
// reference; the XML properties are named err_o_portable, err_o_avx2, ...
TEST_P(KernelTest, ForwardAndBackwardMatchFp64Reference) {
  for (const auto& [path, e] : run_case_on_paths(GetParam(), /*backward=*/true)) {
    const std::string suffix = std::string("_") + kernel_path_name(path);
    EXPECT_LE(e.out, kFp32RelativeBound) << "O" << suffix;
    EXPECT_LE(e.lse, kFp32RelativeBound) << "LSE" << suffix;
    EXPECT_LE(e.dq, kFp32RelativeBound) << "dQ" << suffix;
    EXPECT_LE(e.dk, kFp32RelativeBound) << "dK" << suffix;
    EXPECT_LE(e.dv, kFp32RelativeBound) << "dV" << suffix;
    for (const auto& [name, value] : {std::pair{"err_o", e.out},
                                      {"err_lse", e.lse},
                                      {"err_dq", e.dq},
                                      {"err_dk", e.dk},
                                      {"err_dv", e.dv}}) {
      char text[32];
      std::snprintf(text, sizeof text, "%.3e", value);
      RecordProperty(name + suffix, text);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(NonFinite, KernelTest, ::testing::ValuesIn(nonfinite_cases()),
                         [](const auto& p) {
                           return p.param.name() + "_" + std::to_string(p.index);
                         });
INSTANTIATE_TEST_SUITE_P(Matrix, KernelTest, ::testing::ValuesIn(kernel_cases()),
                         [](const auto& p) {
                           return p.param.name() + "_" + std::to_string(p.index);
                         });

}  // namespace
}  // namespace a2d::test
