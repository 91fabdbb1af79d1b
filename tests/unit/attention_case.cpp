#include "attention_case.hpp"

#include <algorithm>
#include <limits>
#include <random>
#include <sstream>

#include "attention2d/reference.hpp"
#include "attention2d/tools/check.hpp"
#include "attention2d/tools/data.hpp"
#include "backends/cpu/kernels/cpu_kernels.hpp"

namespace a2d::test {
namespace {

const char* positions_name(Positions p) {
  switch (p) {
    case Positions::contiguous:
      return "contiguous";
    case Positions::strided:
      return "strided";
    case Positions::arbitrary:
      return "arbitrary";
    case Positions::shuffled:
      return "shuffled";
  }
  return "?";
}

std::vector<double> widen(const std::vector<float>& x) {
  return {x.begin(), x.end()};
}

}  // namespace

std::string Case::name() const {
  std::ostringstream out;
  out << "B" << batch << "_H" << heads << "_" << kv_heads << "_Nq" << q_tokens << "_Nk" << kv_tokens
      << "_D" << head_dim << "_"
      << (mask.kind == MaskKind::causal_window ? "window" + std::to_string(mask.window)
                                               : mask.describe())
      << "_" << positions_name(positions) << "_T" << threads;
  if (amplitude != 1.0f) out << "_amp" << static_cast<int>(amplitude);
  if (scale > 0) out << "_customscale";
  if (mask.has_documents()) out << "_docs" << mask.documents();
  if (softcap > 0) out << "_softcap";
  if (sinks) out << "_sinks";
  if (nan_q_row >= 0 || inf_k_row >= 0 || nan_v_row >= 0) out << "_nonfinite";
  return out.str();
}

std::ostream& operator<<(std::ostream& out, const Case& c) {
  return out << c.name();
}

Problem make_problem(const Case& c) {
  Problem p;
  p.shape = {c.batch, c.heads, c.kv_heads, c.q_tokens, c.kv_tokens, c.head_dim};
  p.scale = c.scale > 0 ? c.scale : default_scale(c.head_dim);
  p.q = generate_tokens(c.seed, TensorTag::q, {c.batch, c.q_tokens, c.heads, c.head_dim},
                        c.amplitude);
  p.k = generate_tokens(c.seed, TensorTag::k, {c.batch, c.kv_tokens, c.kv_heads, c.head_dim},
                        c.amplitude);
  p.v = generate_tokens(c.seed, TensorTag::v, {c.batch, c.kv_tokens, c.kv_heads, c.head_dim});
  p.d_out = generate_tokens(c.seed, TensorTag::d_out, {c.batch, c.q_tokens, c.heads, c.head_dim});

  const float nan = std::numeric_limits<float>::quiet_NaN();
  if (c.nan_q_row >= 0) p.q[(c.nan_q_row * c.heads) * c.head_dim + 1] = nan;
  if (c.inf_k_row >= 0)
    p.k[(c.inf_k_row * c.kv_heads) * c.head_dim] = std::numeric_limits<float>::infinity();
  if (c.nan_v_row >= 0) p.v[(c.nan_v_row * c.kv_heads) * c.head_dim] = nan;

  if (c.sinks) p.sinks = generate_sinks(c.seed, c.heads);
  std::mt19937_64 rng(c.seed * 7919 + 13);
  switch (c.positions) {
    case Positions::contiguous:
      break;
    case Positions::strided:
      for (int64_t i = 0; i < c.q_tokens; ++i)
        p.q_positions.push_back(3 + 4 * i);
      for (int64_t j = 0; j < c.kv_tokens; ++j)
        p.kv_positions.push_back(1 + 4 * j);
      break;
    case Positions::arbitrary:
    case Positions::shuffled: {
      std::uniform_int_distribution<int64_t> gap(1, 5);
      int64_t q = 0, k = 0;
      for (int64_t i = 0; i < c.q_tokens; ++i)
        p.q_positions.push_back(q += gap(rng));
      for (int64_t j = 0; j < c.kv_tokens; ++j)
        p.kv_positions.push_back(k += gap(rng));
      if (c.positions == Positions::shuffled) {
        std::shuffle(p.q_positions.begin(), p.q_positions.end(), rng);
        std::shuffle(p.kv_positions.begin(), p.kv_positions.end(), rng);
      }
      break;
    }
  }
  return p;
}

namespace {

struct Outputs {
  std::vector<float> out, lse, dq, dk, dv, dsink;
};

// The fp32 kernels on the current path.
Outputs run_kernels(const Problem& p, const Case& c, bool backward) {
  const AttentionShape& s = p.shape;
  Outputs r;
  r.out.resize(p.q.size());
  r.lse.resize(static_cast<size_t>(s.batch * s.heads * s.q_tokens));
  ForwardArgs fwd;
  fwd.shape = s;
  fwd.mask = c.mask;
  fwd.scale = p.scale;
  fwd.softcap = c.softcap;
  fwd.q = dense_tokens(p.q.data(), s.q_tokens, s.heads, s.head_dim);
  fwd.k = dense_tokens(p.k.data(), s.kv_tokens, s.kv_heads, s.head_dim);
  fwd.v = dense_tokens(p.v.data(), s.kv_tokens, s.kv_heads, s.head_dim);
  fwd.q_positions = p.q_pos();
  fwd.kv_positions = p.kv_pos();
  fwd.threads = c.threads;
  attention_forward(fwd, dense_tokens(r.out.data(), s.q_tokens, s.heads, s.head_dim),
                    dense_rows(r.lse.data(), s.heads, s.q_tokens));
  const RowsShape rows{s.batch, s.q_tokens, s.heads, s.head_dim};
  if (c.sinks) {
    add_sinks(rows, p.sinks.data(), 0, dense_tokens(r.out.data(), s.q_tokens, s.heads, s.head_dim),
              dense_rows(r.lse.data(), s.heads, s.q_tokens));
  }
  if (!backward) return r;

  r.dq.resize(p.q.size());
  r.dk.resize(p.k.size());
  r.dv.resize(p.v.size());
  BackwardArgs bwd;
  bwd.shape = s;
  bwd.mask = c.mask;
  bwd.scale = p.scale;
  bwd.softcap = c.softcap;
  bwd.q = fwd.q;
  bwd.k = fwd.k;
  bwd.v = fwd.v;
  bwd.out = dense_tokens(r.out.data(), s.q_tokens, s.heads, s.head_dim);
  bwd.d_out = dense_tokens(p.d_out.data(), s.q_tokens, s.heads, s.head_dim);
  bwd.lse = dense_rows(r.lse.data(), s.heads, s.q_tokens);
  bwd.q_positions = p.q_pos();
  bwd.kv_positions = p.kv_pos();
  bwd.threads = c.threads;
  attention_backward(bwd, dense_tokens(r.dq.data(), s.q_tokens, s.heads, s.head_dim),
                     dense_tokens(r.dk.data(), s.kv_tokens, s.kv_heads, s.head_dim),
                     dense_tokens(r.dv.data(), s.kv_tokens, s.kv_heads, s.head_dim));
  if (c.sinks) {
    std::vector<float> delta(r.lse.size());
    compute_delta(rows, bwd.out, bwd.d_out, dense_rows(delta.data(), s.heads, s.q_tokens));
    std::vector<double> dsink(static_cast<size_t>(s.heads), 0.0);
    add_sink_gradient(rows, p.sinks.data(), 0, bwd.lse,
                      dense_rows<const float>(delta.data(), s.heads, s.q_tokens), dsink.data());
    r.dsink.assign(dsink.begin(), dsink.end());
  }
  return r;
}

struct ReferenceOutputs {
  std::vector<double> out, lse, dq, dk, dv, dsink;
};

ReferenceOutputs run_reference(const Problem& p, const Case& c, bool backward) {
  const AttentionShape& s = p.shape;
  const std::vector<double> q64 = widen(p.q), k64 = widen(p.k), v64 = widen(p.v);
  reference::Inputs in{s,          c.mask,     static_cast<double>(p.scale),
                       q64.data(), k64.data(), v64.data(),
                       p.q_pos(),  p.kv_pos(), 2};
  const std::vector<double> sinks64 = widen(p.sinks);
  in.softcap = c.softcap;
  in.sinks = c.sinks ? sinks64.data() : nullptr;
  ReferenceOutputs r;
  r.out.resize(p.q.size());
  r.lse.resize(static_cast<size_t>(s.batch * s.heads * s.q_tokens));
  reference::forward(in, r.out.data(), r.lse.data());
  if (!backward) return r;
  const std::vector<double> do64 = widen(p.d_out);
  r.dq.resize(p.q.size());
  r.dk.resize(p.k.size());
  r.dv.resize(p.v.size());
  r.dsink.resize(static_cast<size_t>(s.heads));
  reference::backward(in, do64.data(), r.dq.data(), r.dk.data(), r.dv.data(), nullptr,
                      r.dsink.data());
  if (!c.sinks) r.dsink.clear();
  return r;
}

double error_of(const std::vector<float>& got, const std::vector<double>& expected) {
  return relative_error(got.data(), expected.data(), static_cast<int64_t>(got.size()));
}

Errors compare(const Outputs& got, const ReferenceOutputs& expected, bool backward) {
  Errors e;
  e.out = error_of(got.out, expected.out);
  e.lse = error_of(got.lse, expected.lse);
  if (!backward) return e;
  e.dq = error_of(got.dq, expected.dq);
  e.dk = error_of(got.dk, expected.dk);
  e.dv = error_of(got.dv, expected.dv);
  if (!expected.dsink.empty()) e.dsink = error_of(got.dsink, expected.dsink);
  return e;
}

}  // namespace

Errors run_case(const Case& c, bool backward) {
  const Problem p = make_problem(c);
  return compare(run_kernels(p, c, backward), run_reference(p, c, backward), backward);
}

std::vector<PathErrors> run_case_on_paths(const Case& c, bool backward) {
  const Problem p = make_problem(c);
  const ReferenceOutputs expected = run_reference(p, c, backward);
  std::vector<PathErrors> errors;
  for (const KernelPath path : supported_paths()) {
    const PathScope scope(path);
    errors.push_back({path, compare(run_kernels(p, c, backward), expected, backward)});
  }
  return errors;
}

std::vector<KernelPath> supported_paths() {
  std::vector<KernelPath> paths;
  for (const KernelPath path : {KernelPath::portable, KernelPath::avx2, KernelPath::avx512}) {
    if (kernel_path_supported(path)) paths.push_back(path);
  }
  return paths;
}

std::vector<KernelPath> bf16_paths() {
  std::vector<KernelPath> paths = supported_paths();
  for (const KernelPath path : {KernelPath::avx512bf16, KernelPath::amx})
    if (kernel_path_supported(path)) paths.push_back(path);
  return paths;
}

}  // namespace a2d::test
