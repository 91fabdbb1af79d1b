// The fp64 reference backward against central finite differences of the fp64 reference forward,
// and the fp32 kernel backward against the same finite differences, on small cases.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <vector>

#include "attention2d/kernel.hpp"
#include "attention2d/reference.hpp"
#include "attention2d/tools/data.hpp"
#include "attention_case.hpp"
#include "backends/cpu/kernels/cpu_kernels.hpp"

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
  s.d_out =
      widen(generate_tokens(3, TensorTag::d_out, {sh.batch, sh.q_tokens, sh.heads, sh.head_dim}));
  return s;
}

constexpr double kScale = 0.7;

// loss = sum(O * dO), the quantity whose gradients the backward returns.
double loss(const Small& s) {
  std::vector<double> out(s.q.size()),
      lse(static_cast<size_t>(s.shape.batch * s.shape.heads * s.shape.q_tokens));
  reference::forward({s.shape, s.mask, kScale, s.q.data(), s.k.data(), s.v.data(), s.q_pos.data(),
                      s.k_pos.data(), 1},
                     out.data(), lse.data());
  double total = 0.0;
  for (size_t i = 0; i < out.size(); ++i)
    total += out[i] * s.d_out[i];
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
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

// The fp32 kernel's forward on a Small case, with the backward's arguments ready. Holds the
// tensors the arguments point into, so it is neither copied nor moved.
class Fp32Case {
 public:
  Fp32Case(const Small& s, float scale)
      : sh_(s.shape),
        q_(narrow(s.q)),
        k_(narrow(s.k)),
        v_(narrow(s.v)),
        g_(narrow(s.d_out)),
        out_(q_.size()),
        lse_(static_cast<size_t>(sh_.batch * sh_.heads * sh_.q_tokens)),
        dq(q_.size()),
        dk(k_.size()),
        dv(v_.size()) {
    ForwardArgs fwd;
    fwd.shape = sh_;
    fwd.mask = s.mask;
    fwd.scale = scale;
    fwd.q = dense_tokens(q_.data(), sh_.q_tokens, sh_.heads, sh_.head_dim);
    fwd.k = dense_tokens(k_.data(), sh_.kv_tokens, sh_.kv_heads, sh_.head_dim);
    fwd.v = dense_tokens(v_.data(), sh_.kv_tokens, sh_.kv_heads, sh_.head_dim);
    fwd.q_positions = s.q_pos.data();
    fwd.kv_positions = s.k_pos.data();
    attention_forward(fwd, dense_tokens(out_.data(), sh_.q_tokens, sh_.heads, sh_.head_dim),
                      dense_rows(lse_.data(), sh_.heads, sh_.q_tokens));
    bwd.shape = sh_;
    bwd.mask = s.mask;
    bwd.scale = scale;
    bwd.q = fwd.q;
    bwd.k = fwd.k;
    bwd.v = fwd.v;
    bwd.out = dense_tokens(out_.data(), sh_.q_tokens, sh_.heads, sh_.head_dim);
    bwd.d_out = dense_tokens(g_.data(), sh_.q_tokens, sh_.heads, sh_.head_dim);
    bwd.lse = dense_rows(lse_.data(), sh_.heads, sh_.q_tokens);
    bwd.q_positions = fwd.q_positions;
    bwd.kv_positions = fwd.kv_positions;
  }
  Fp32Case(const Fp32Case&) = delete;
  Fp32Case& operator=(const Fp32Case&) = delete;

  // The backward into dq, dk, dv (adding to them when bwd.accumulate is set).
  void backward() {
    attention_backward(bwd, dense_tokens(dq.data(), sh_.q_tokens, sh_.heads, sh_.head_dim),
                       dense_tokens(dk.data(), sh_.kv_tokens, sh_.kv_heads, sh_.head_dim),
                       dense_tokens(dv.data(), sh_.kv_tokens, sh_.kv_heads, sh_.head_dim));
  }

 private:
  static std::vector<float> narrow(const std::vector<double>& x) { return {x.begin(), x.end()}; }
  AttentionShape sh_;
  std::vector<float> q_, k_, v_, g_, out_, lse_;

 public:
  BackwardArgs bwd;
  std::vector<float> dq, dk, dv;
};

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
    Fp32Case run(s, static_cast<float>(kScale));
    run.backward();
    auto widen = [](const std::vector<float>& x) {
      return std::vector<double>(x.begin(), x.end());
    };
    // fp32 arithmetic on values of order 1: a few units of 2^-24 per term.
    EXPECT_LE(max_abs_diff(widen(run.dq), fd_q), 1e-5);
    EXPECT_LE(max_abs_diff(widen(run.dk), fd_k), 1e-5);
    EXPECT_LE(max_abs_diff(widen(run.dv), fd_v), 1e-5);
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
    Fp32Case run(s, 0.7f);
    run.backward();
    const std::vector<float> dq1 = run.dq, dk1 = run.dk, dv1 = run.dv;
    run.bwd.accumulate = true;
    run.backward();
    // The second pass adds its terms one by one onto the first result, so the sums round
    // differently from 2 x the first: allow a few fp32 units.
    auto near_double = [](const std::vector<float>& twice, const std::vector<float>& once) {
      for (size_t i = 0; i < once.size(); ++i) {
        EXPECT_NEAR(twice[i], 2 * once[i], 1e-6 * (1 + std::abs(once[i]))) << i;
      }
    };
    near_double(run.dq, dq1);
    near_double(run.dk, dk1);
    near_double(run.dv, dv1);
  }
}

std::atomic<int64_t> g_reference_rows{0};
void count_reference_row() {
  g_reference_rows.fetch_add(1);
}

// The reference reports its progress once per row, from every thread (a watchdog's heartbeat:
// a2d run --check at long sequences), and reporting changes nothing it computes.
TEST(Reference, ReportsProgressOncePerRow) {
  const Small s = make_small(Mask::causal());
  const AttentionShape& sh = s.shape;
  const int64_t q_rows = sh.batch * sh.heads * sh.q_tokens;
  const int64_t kv_rows = sh.batch * sh.kv_heads * sh.kv_tokens;
  struct Result {
    std::vector<double> out, lse, dq, dk, dv;
  };
  auto run = [&](void (*progress)()) {
    reference::Inputs in{sh, s.mask, kScale, s.q.data(), s.k.data(), s.v.data()};
    in.q_positions = s.q_pos.data();
    in.kv_positions = s.k_pos.data();
    in.threads = 2;
    in.progress = progress;
    Result r{std::vector<double>(s.q.size()), std::vector<double>(static_cast<size_t>(q_rows)),
             std::vector<double>(s.q.size()), std::vector<double>(s.k.size()),
             std::vector<double>(s.v.size())};
    g_reference_rows = 0;
    reference::forward(in, r.out.data(), r.lse.data());
    EXPECT_EQ(g_reference_rows.load(), progress ? q_rows : 0);
    g_reference_rows = 0;
    reference::backward(in, s.d_out.data(), r.dq.data(), r.dk.data(), r.dv.data());
    EXPECT_EQ(g_reference_rows.load(), progress ? q_rows + kv_rows : 0);
    return r;
  };
  const Result counted = run(&count_reference_row);
  const Result plain = run(nullptr);
  EXPECT_EQ(counted.out, plain.out);
  EXPECT_EQ(counted.lse, plain.lse);
  EXPECT_EQ(counted.dq, plain.dq);
  EXPECT_EQ(counted.dk, plain.dk);
  EXPECT_EQ(counted.dv, plain.dv);
}

}  // namespace
}  // namespace a2d
