// The fp64 reference backward against central finite differences of the fp64 reference forward,
// and the fp32 kernel backward against the same finite differences, on small cases.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "attention2d/data.hpp"
#include "attention2d/kernel.hpp"
#include "attention2d/reference.hpp"
#include "attention_case.hpp"

namespace a2d {
namespace {

struct Small {
  AttentionShape shape{2, 4, 2, 5, 7, 3};  // batch 2, GQA 4:2, Nq != Nk, tiny head dim
  Mask mask;
  std::vector<double> q, k, v, d_out;
  std::vector<int64_t> q_pos = {2, 3, 5, 6, 8}, k_pos = {0, 1, 2, 4, 5, 7, 9};
};

Small make_small(const Mask& mask) {
  Small s;
  s.mask = mask;
  auto widen = [](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); };
  const auto& sh = s.shape;
  s.q = widen(generate_tokens(3, TensorTag::q, {sh.batch, sh.q_tokens, sh.heads, sh.head_dim}));
  s.k = widen(generate_tokens(3, TensorTag::k, {sh.batch, sh.kv_tokens, sh.kv_heads, sh.head_dim}));
  s.v = widen(generate_tokens(3, TensorTag::v, {sh.batch, sh.kv_tokens, sh.kv_heads, sh.head_dim}));
  s.d_out = widen(generate_tokens(3, TensorTag::d_out, {sh.batch, sh.q_tokens, sh.heads, sh.head_dim}));
  return s;
}

constexpr double kScale = 0.7;

// loss = sum(O * dO), the quantity whose gradients the backward returns.
double loss(const Small& s) {
  std::vector<double> out(s.q.size()), lse(static_cast<size_t>(s.shape.batch * s.shape.heads * s.shape.q_tokens));
  reference::forward({s.shape, s.mask, kScale, s.q.data(), s.k.data(), s.v.data(), s.q_pos.data(),
                      s.k_pos.data(), 1},
                     out.data(), lse.data());
  double total = 0.0;
  for (size_t i = 0; i < out.size(); ++i) total += out[i] * s.d_out[i];
  return total;
}

std::vector<double> finite_difference(Small s, std::vector<double> Small::*tensor) {
  const double h = 1e-6;
  std::vector<double> grad((s.*tensor).size());
  for (size_t i = 0; i < grad.size(); ++i) {
    const double saved = (s.*tensor)[i];
    (s.*tensor)[i] = saved + h;
    const double up = loss(s);
    (s.*tensor)[i] = saved - h;
    const double down = loss(s);
    (s.*tensor)[i] = saved;
    grad[i] = (up - down) / (2 * h);
  }
  return grad;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

class GradCheck : public ::testing::TestWithParam<Mask> {};

TEST_P(GradCheck, ReferenceAndKernelBackwardMatchFiniteDifferences) {
  const Small s = make_small(GetParam());
  std::vector<double> dq(s.q.size()), dk(s.k.size()), dv(s.v.size());
  reference::backward({s.shape, s.mask, kScale, s.q.data(), s.k.data(), s.v.data(), s.q_pos.data(),
                       s.k_pos.data(), 1},
                      s.d_out.data(), dq.data(), dk.data(), dv.data());
  const auto fd_q = finite_difference(s, &Small::q);
  const auto fd_k = finite_difference(s, &Small::k);
  const auto fd_v = finite_difference(s, &Small::v);
  // Central differences with h = 1e-6 in fp64: truncation ~h^2, cancellation ~1e-16/h = 1e-10.
  EXPECT_LE(max_abs_diff(dq, fd_q), 1e-8);
  EXPECT_LE(max_abs_diff(dk, fd_k), 1e-8);
  EXPECT_LE(max_abs_diff(dv, fd_v), 1e-8);

  // The fp32 kernel on the same (exactly representable) inputs, on every kernel path.
  for (const KernelPath path : test::supported_paths()) {
    SCOPED_TRACE(kernel_path_name(path));
    const test::PathScope scope(path);
    auto narrow = [](const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); };
    const std::vector<float> q = narrow(s.q), k = narrow(s.k), v = narrow(s.v), g = narrow(s.d_out);
    const auto& sh = s.shape;
    std::vector<float> out(q.size()), lse(static_cast<size_t>(sh.batch * sh.heads * sh.q_tokens));
    ForwardArgs fwd;
    fwd.shape = sh;
    fwd.mask = s.mask;
    fwd.scale = static_cast<float>(kScale);
    fwd.q = dense_tokens(q.data(), sh.q_tokens, sh.heads, sh.head_dim);
    fwd.k = dense_tokens(k.data(), sh.kv_tokens, sh.kv_heads, sh.head_dim);
    fwd.v = dense_tokens(v.data(), sh.kv_tokens, sh.kv_heads, sh.head_dim);
    fwd.q_positions = s.q_pos.data();
    fwd.kv_positions = s.k_pos.data();
    attention_forward(fwd, dense_tokens(out.data(), sh.q_tokens, sh.heads, sh.head_dim),
                      dense_rows(lse.data(), sh.heads, sh.q_tokens));
    BackwardArgs bwd;
    bwd.shape = sh;
    bwd.mask = s.mask;
    bwd.scale = fwd.scale;
    bwd.q = fwd.q;
    bwd.k = fwd.k;
    bwd.v = fwd.v;
    bwd.out = dense_tokens(out.data(), sh.q_tokens, sh.heads, sh.head_dim);
    bwd.d_out = dense_tokens(g.data(), sh.q_tokens, sh.heads, sh.head_dim);
    bwd.lse = dense_rows(lse.data(), sh.heads, sh.q_tokens);
    bwd.q_positions = fwd.q_positions;
    bwd.kv_positions = fwd.kv_positions;
    std::vector<float> dq32(q.size()), dk32(k.size()), dv32(v.size());
    attention_backward(bwd, dense_tokens(dq32.data(), sh.q_tokens, sh.heads, sh.head_dim),
                       dense_tokens(dk32.data(), sh.kv_tokens, sh.kv_heads, sh.head_dim),
                       dense_tokens(dv32.data(), sh.kv_tokens, sh.kv_heads, sh.head_dim));
    auto widen = [](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); };
    // fp32 arithmetic on values of order 1: a few units of 2^-24 per term.
    EXPECT_LE(max_abs_diff(widen(dq32), fd_q), 1e-5);
    EXPECT_LE(max_abs_diff(widen(dk32), fd_k), 1e-5);
    EXPECT_LE(max_abs_diff(widen(dv32), fd_v), 1e-5);
  }
}

INSTANTIATE_TEST_SUITE_P(Masks, GradCheck,
                         ::testing::Values(Mask::none(), Mask::causal(), Mask::causal_window(3)),
                         [](const auto& p) {
                           return p.param.kind == MaskKind::causal_window ? std::string("window")
                                                                          : p.param.describe();
                         });

TEST(Backward, AccumulateAddsToExistingGradients) {
  for (const KernelPath path : test::supported_paths()) {
    SCOPED_TRACE(kernel_path_name(path));
    const test::PathScope scope(path);
    const Small s = make_small(Mask::causal());
    auto narrow = [](const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); };
    const std::vector<float> q = narrow(s.q), k = narrow(s.k), v = narrow(s.v), g = narrow(s.d_out);
    const auto& sh = s.shape;
    std::vector<float> out(q.size()), lse(static_cast<size_t>(sh.batch * sh.heads * sh.q_tokens));
    ForwardArgs fwd;
    fwd.shape = sh;
    fwd.mask = s.mask;
    fwd.scale = 0.7f;
    fwd.q = dense_tokens(q.data(), sh.q_tokens, sh.heads, sh.head_dim);
    fwd.k = dense_tokens(k.data(), sh.kv_tokens, sh.kv_heads, sh.head_dim);
    fwd.v = dense_tokens(v.data(), sh.kv_tokens, sh.kv_heads, sh.head_dim);
    fwd.q_positions = s.q_pos.data();
    fwd.kv_positions = s.k_pos.data();
    attention_forward(fwd, dense_tokens(out.data(), sh.q_tokens, sh.heads, sh.head_dim),
                      dense_rows(lse.data(), sh.heads, sh.q_tokens));
    BackwardArgs bwd;
    bwd.shape = sh;
    bwd.mask = s.mask;
    bwd.scale = 0.7f;
    bwd.q = fwd.q;
    bwd.k = fwd.k;
    bwd.v = fwd.v;
    bwd.out = dense_tokens(out.data(), sh.q_tokens, sh.heads, sh.head_dim);
    bwd.d_out = dense_tokens(g.data(), sh.q_tokens, sh.heads, sh.head_dim);
    bwd.lse = dense_rows(lse.data(), sh.heads, sh.q_tokens);
    bwd.q_positions = fwd.q_positions;
    bwd.kv_positions = fwd.kv_positions;
    std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
    auto run = [&] {
      attention_backward(bwd, dense_tokens(dq.data(), sh.q_tokens, sh.heads, sh.head_dim),
                         dense_tokens(dk.data(), sh.kv_tokens, sh.kv_heads, sh.head_dim),
                         dense_tokens(dv.data(), sh.kv_tokens, sh.kv_heads, sh.head_dim));
    };
    run();
    const std::vector<float> dq1 = dq, dk1 = dk, dv1 = dv;
    bwd.accumulate = true;
    run();
    // The second pass adds its terms one by one onto the first result, so the sums round
    // differently from 2 x the first: allow a few fp32 units.
    auto near_double = [](const std::vector<float>& twice, const std::vector<float>& once) {
      for (size_t i = 0; i < once.size(); ++i) {
        EXPECT_NEAR(twice[i], 2 * once[i], 1e-6 * (1 + std::abs(once[i]))) << i;
      }
    };
    near_double(dq, dq1);
    near_double(dk, dk1);
    near_double(dv, dv1);
  }
}

}  // namespace
}  // namespace a2d
