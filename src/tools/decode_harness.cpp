#include "attention2d/tools/decode_harness.hpp"

#include <cmath>
#include <cstddef>
#include <limits>

#include "attention2d/error.hpp"
#include "attention2d/reference.hpp"
#include "attention2d/session.hpp"
#include "attention2d/tools/data.hpp"

namespace a2d {
namespace {

std::vector<float> generated_rows(const Problem& p, uint64_t seed, TensorTag tag, int64_t heads,
                                  int64_t total, const std::vector<int64_t>& positions) {
  const int64_t n = static_cast<int64_t>(positions.size());
  std::vector<float> rows(static_cast<size_t>(p.batch * n * heads * p.head_dim));
  fill_generated(seed, tag, {p.batch, total, heads, p.head_dim}, positions.data(), n,
                 dense_tokens(rows.data(), n, heads, p.head_dim));
  for (float& x : rows)
    x = round_to(p.dtype, x);
  return rows;
}

// The values (already the dtype's) in a new buffer, converted by the backend (session.hpp).
BufferPtr upload_tokens(Backend& backend, const Problem& p, int64_t heads,
                        std::vector<float>& values) {
  const int64_t count = static_cast<int64_t>(values.size());
  BufferPtr buffer = backend.allocate(std::max<int64_t>(1, count * dtype_bytes(p.dtype)));
  const int64_t tokens = count / std::max<int64_t>(1, p.batch * heads * p.head_dim);
  upload_values(backend, values, *buffer, p.dtype, {p.batch, tokens, heads, p.head_dim});
  return buffer;
}

}  // namespace

DecodeTokens make_decode_tokens(const Problem& problem, Backend& backend, uint64_t seed,
                                int64_t total, const std::vector<int64_t>& positions) {
  for (const int64_t t : positions)
    A2D_REQUIRE(t >= 0 && t < total, "token ", t, " lies outside the run's ", total, " tokens");
  DecodeTokens d;
  d.problem = problem;
  d.backend = &backend;
  d.positions = positions;
  d.q = generated_rows(problem, seed, TensorTag::q, problem.heads, total, positions);
  d.k = generated_rows(problem, seed, TensorTag::k, problem.kv_heads, total, positions);
  d.v = generated_rows(problem, seed, TensorTag::v, problem.kv_heads, total, positions);
  if (problem.sinks) d.sinks = generate_sinks(seed, problem.heads);
  d.q_buffer = upload_tokens(backend, problem, problem.heads, d.q);
  d.k_buffer = upload_tokens(backend, problem, problem.kv_heads, d.k);
  d.v_buffer = upload_tokens(backend, problem, problem.kv_heads, d.v);
  const int64_t n = d.tokens();
  d.out_buffer = backend.allocate(std::max<int64_t>(
      1, problem.batch * n * problem.heads * problem.head_dim * dtype_bytes(problem.dtype)));
  d.lse_buffer = backend.allocate(std::max<int64_t>(
      1, problem.batch * problem.heads * n * static_cast<int64_t>(sizeof(float))));
  return d;
}

ForwardShards DecodeTokens::forward() {
  const int64_t n = tokens(), h = problem.heads, hkv = problem.kv_heads, d = problem.head_dim;
  ForwardShards s;
  s.q = dense_token_tensor(*q_buffer, problem.dtype, n, h, d);
  s.k = dense_token_tensor(*k_buffer, problem.dtype, n, hkv, d);
  s.v = dense_token_tensor(*v_buffer, problem.dtype, n, hkv, d);
  s.out = dense_token_tensor(*out_buffer, problem.dtype, n, h, d);
  s.lse = dense_row_tensor(*lse_buffer, h, n);
  s.sinks = sinks.empty() ? nullptr : sinks.data();
  return s;
}

DecodeShards DecodeTokens::decode() {
  const ForwardShards f = forward();
  return {f.q, f.k, f.v, f.out, f.lse, f.sinks};
}

void DecodeTokens::download() {
  const int64_t n = tokens();
  const int64_t count = problem.batch * n * problem.heads * problem.head_dim;
  out.assign(static_cast<size_t>(count), 0.0f);
  lse.assign(static_cast<size_t>(problem.batch * problem.heads * n), 0.0f);
  if (n == 0) return;
  download_values(*backend, *out_buffer, problem.dtype,
                  {problem.batch, n, problem.heads, problem.head_dim}, out);
  backend->download(Place::in(*lse_buffer), lse.data(),
                    static_cast<int64_t>(lse.size() * sizeof(float)));
}

void DecodeErrors::add(const DecodeErrors& o) {
  out_error += o.out_error;
  out_norm += o.out_norm;
  lse_error += o.lse_error;
  lse_norm += o.lse_norm;
}

double DecodeErrors::out() const {
  return out_norm > 0 ? std::sqrt(out_error / out_norm) : std::sqrt(out_error);
}
double DecodeErrors::lse() const {
  return lse_norm > 0 ? std::sqrt(lse_error / lse_norm) : std::sqrt(lse_error);
}

DecodeReference::DecodeReference(const Problem& problem, uint64_t seed, int64_t total)
    : problem_(problem), total_(total) {
  std::vector<int64_t> all(static_cast<size_t>(total));
  for (int64_t t = 0; t < total; ++t)
    all[static_cast<size_t>(t)] = t;
  const std::vector<float> k =
      generated_rows(problem, seed, TensorTag::k, problem.kv_heads, total, all);
  const std::vector<float> v =
      generated_rows(problem, seed, TensorTag::v, problem.kv_heads, total, all);
  k_.assign(k.begin(), k.end());
  v_.assign(v.begin(), v.end());
  if (problem.sinks) {
    const std::vector<float> s = generate_sinks(seed, problem.heads);
    sinks_.assign(s.begin(), s.end());
  }
}

DecodeErrors DecodeReference::errors(const DecodeTokens& tokens, int threads) const {
  DecodeErrors e;
  const int64_t n = tokens.tokens();
  if (n == 0) return e;
  A2D_REQUIRE(tokens.out.size() ==
                  static_cast<size_t>(problem_.batch * n * problem_.heads * problem_.head_dim),
              "download() the tokens' outputs before comparing them");
  const std::vector<double> q(tokens.q.begin(), tokens.q.end());
  reference::Inputs in;
  in.shape = problem_.local_shape(n, total_);
  in.mask = problem_.mask;
  in.scale = problem_.softmax_scale();
  in.q = q.data();
  in.k = k_.data();
  in.v = v_.data();
  in.q_positions = tokens.positions.data();
  in.threads = threads;
  in.softcap = problem_.softcap;
  in.sinks = sinks_.empty() ? nullptr : sinks_.data();
  std::vector<double> out(q.size()), lse(static_cast<size_t>(problem_.batch * problem_.heads * n));
  reference::forward(in, out.data(), lse.data());
  constexpr double kInf = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < out.size(); ++i) {
    const double d = static_cast<double>(tokens.out[i]) - out[i];
    e.out_error += std::isfinite(d) ? d * d : kInf;
    e.out_norm += out[i] * out[i];
  }
  for (size_t i = 0; i < lse.size(); ++i) {
    const double d = static_cast<double>(tokens.lse[i]) - lse[i];
    e.lse_error += std::isfinite(d) ? d * d : kInf;
    e.lse_norm += lse[i] * lse[i];
  }
  return e;
}

}  // namespace a2d
