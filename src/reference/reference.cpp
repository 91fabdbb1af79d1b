// The double-precision oracle. One query row at a time; every probability is computed exactly
// from its score, so the only approximation is double rounding.
#include "attention2d/reference.hpp"

#include <cmath>
#include <limits>
#include <vector>

#include "attention2d/error.hpp"

namespace a2d::reference {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

struct Layout {
  const AttentionShape& s;
  int64_t q_index(int64_t b, int64_t t, int64_t h) const {
    return ((b * s.q_tokens + t) * s.heads + h) * s.head_dim;
  }
  int64_t kv_index(int64_t b, int64_t t, int64_t h) const {
    return ((b * s.kv_tokens + t) * s.kv_heads + h) * s.head_dim;
  }
  int64_t row_index(int64_t b, int64_t h, int64_t t) const {
    return (b * s.heads + h) * s.q_tokens + t;
  }
};

int64_t position(const int64_t* positions, int64_t index) {
  return positions ? positions[index] : index;
}

double dot(const double* a, const double* b, int64_t n) {
  double sum = 0.0;
  for (int64_t d = 0; d < n; ++d)
    sum += a[d] * b[d];
  return sum;
}

// Scaled scores of one query row (masked keys get -inf), returns the row's LSE.
double row_scores(const Inputs& in, const Layout& at, int64_t b, int64_t h, int64_t i,
                  std::vector<double>& scores) {
  const AttentionShape& s = in.shape;
  const int64_t kvh = s.kv_head_of(h);
  const double* q = in.q + at.q_index(b, i, h);
  const int64_t q_pos = position(in.q_positions, i);
  double row_max = kNegInf;
  for (int64_t j = 0; j < s.kv_tokens; ++j) {
    if (!in.mask.visible(q_pos, position(in.kv_positions, j))) {
      scores[j] = kNegInf;
      continue;
    }
    scores[j] = in.scale * dot(q, in.k + at.kv_index(b, j, kvh), s.head_dim);
    if (in.softcap > 0) scores[j] = in.softcap * std::tanh(scores[j] / in.softcap);
    row_max = max_keep_nan(row_max, scores[j]);
  }
  // The sink is one more column of the softmax, with value 0.
  const double sink = in.sinks ? in.sinks[h] : kNegInf;
  row_max = max_keep_nan(row_max, sink);
  if (row_max == kNegInf) return kNegInf;
  double sum = sink == kNegInf ? 0.0 : std::exp(sink - row_max);
  for (int64_t j = 0; j < s.kv_tokens; ++j) {
    if (scores[j] != kNegInf) sum += std::exp(scores[j] - row_max);
  }
  return row_max + std::log(sum);
}

// d(softcapped score) / d(score) = 1 - tanh^2, from the softcapped score.
double softcap_slope(const Inputs& in, double capped) {
  if (in.softcap <= 0) return 1.0;
  const double t = capped / in.softcap;
  return 1.0 - t * t;
}

void check(const Inputs& in) {
  in.shape.validate();
  in.mask.validate();
  A2D_REQUIRE(std::isfinite(in.scale) && in.scale > 0,
              "the softmax scale must be finite and "
              "positive (got ",
              in.scale, ")");
}

}  // namespace

void forward(const Inputs& in, double* out, double* lse) {
  check(in);
  const AttentionShape& s = in.shape;
  const Layout at{s};
  const int64_t rows = s.batch * s.heads * s.q_tokens;
#pragma omp parallel num_threads(in.threads)
  {
    std::vector<double> scores(static_cast<size_t>(s.kv_tokens));
#pragma omp for schedule(dynamic, 16)
    for (int64_t r = 0; r < rows; ++r) {
      if (in.progress) in.progress();
      const int64_t i = r % s.q_tokens;
      const int64_t h = (r / s.q_tokens) % s.heads;
      const int64_t b = r / (s.q_tokens * s.heads);
      const double row_lse = row_scores(in, at, b, h, i, scores);
      lse[at.row_index(b, h, i)] = row_lse;
      double* o = out + at.q_index(b, i, h);
      for (int64_t d = 0; d < s.head_dim; ++d)
        o[d] = 0.0;
      if (row_lse == kNegInf) continue;
      const int64_t kvh = s.kv_head_of(h);
      for (int64_t j = 0; j < s.kv_tokens; ++j) {
        if (scores[j] == kNegInf) continue;
        const double p = std::exp(scores[j] - row_lse);
        const double* v = in.v + at.kv_index(b, j, kvh);
        for (int64_t d = 0; d < s.head_dim; ++d)
          o[d] += p * v[d];
      }
    }
  }
}

void backward(const Inputs& in, const double* d_out, double* dq, double* dk, double* dv,
              const double* out_for_delta, double* dsink) {
  check(in);
  const AttentionShape& s = in.shape;
  const Layout at{s};
  const int64_t rows = s.batch * s.heads * s.q_tokens;
  // Per row: LSE and delta_i = sum_j P_ij dP_ij with dP_ij = dO_i . V_j.
  std::vector<double> lse(static_cast<size_t>(rows)), delta(static_cast<size_t>(rows));

  // Pass 1, over query rows: LSE, delta and dQ_i = scale * sum_j dS_ij K_j with
  // dS_ij = P_ij (dP_ij - delta_i).
#pragma omp parallel num_threads(in.threads)
  {
    std::vector<double> scores(static_cast<size_t>(s.kv_tokens));
    std::vector<double> d_prob(static_cast<size_t>(s.kv_tokens));
#pragma omp for schedule(dynamic, 16)
    for (int64_t r = 0; r < rows; ++r) {
      if (in.progress) in.progress();
      const int64_t i = r % s.q_tokens;
      const int64_t h = (r / s.q_tokens) % s.heads;
      const int64_t b = r / (s.q_tokens * s.heads);
      const int64_t kvh = s.kv_head_of(h);
      const int64_t row = at.row_index(b, h, i);
      lse[row] = row_scores(in, at, b, h, i, scores);
      double* dq_row = dq + at.q_index(b, i, h);
      for (int64_t d = 0; d < s.head_dim; ++d)
        dq_row[d] = 0.0;
      if (lse[row] == kNegInf) {
        delta[row] = 0.0;
        continue;
      }
      const double* do_row = d_out + at.q_index(b, i, h);
      double row_delta = 0.0;
      for (int64_t j = 0; j < s.kv_tokens; ++j) {
        if (scores[j] == kNegInf) continue;
        d_prob[j] = dot(do_row, in.v + at.kv_index(b, j, kvh), s.head_dim);
        row_delta += std::exp(scores[j] - lse[row]) * d_prob[j];
      }
      if (out_for_delta) row_delta = dot(do_row, out_for_delta + at.q_index(b, i, h), s.head_dim);
      delta[row] = row_delta;
      for (int64_t j = 0; j < s.kv_tokens; ++j) {
        if (scores[j] == kNegInf) continue;
        const double ds =
            std::exp(scores[j] - lse[row]) * (d_prob[j] - row_delta) * softcap_slope(in, scores[j]);
        const double* k = in.k + at.kv_index(b, j, kvh);
        for (int64_t d = 0; d < s.head_dim; ++d)
          dq_row[d] += in.scale * ds * k[d];
      }
    }
  }

  if (in.sinks && dsink) {
    for (int64_t h = 0; h < s.heads; ++h) {
      double sum = 0.0;
      for (int64_t b = 0; b < s.batch; ++b)
        for (int64_t i = 0; i < s.q_tokens; ++i) {
          const int64_t row = at.row_index(b, h, i);
          sum += std::exp(in.sinks[h] - lse[row]) * delta[row];
        }
      dsink[h] = -sum;
    }
  }

  // Pass 2, over key rows: dV_j = sum_{h in group, i} P_ij dO_i and
  // dK_j = scale * sum_{h in group, i} dS_ij Q_i.
  const int64_t key_rows = s.batch * s.kv_heads * s.kv_tokens;
#pragma omp parallel for schedule(dynamic, 16) num_threads(in.threads)
  for (int64_t r = 0; r < key_rows; ++r) {
    if (in.progress) in.progress();
    const int64_t j = r % s.kv_tokens;
    const int64_t kvh = (r / s.kv_tokens) % s.kv_heads;
    const int64_t b = r / (s.kv_tokens * s.kv_heads);
    double* dk_row = dk + at.kv_index(b, j, kvh);
    double* dv_row = dv + at.kv_index(b, j, kvh);
    for (int64_t d = 0; d < s.head_dim; ++d)
      dk_row[d] = dv_row[d] = 0.0;
    const double* k = in.k + at.kv_index(b, j, kvh);
    const double* v = in.v + at.kv_index(b, j, kvh);
    const int64_t k_pos = position(in.kv_positions, j);
    for (int64_t h = kvh * s.group_size(); h < (kvh + 1) * s.group_size(); ++h) {
      for (int64_t i = 0; i < s.q_tokens; ++i) {
        if (!in.mask.visible(position(in.q_positions, i), k_pos)) continue;
        const int64_t row = at.row_index(b, h, i);
        const double* q = in.q + at.q_index(b, i, h);
        const double* do_row = d_out + at.q_index(b, i, h);
        double score = in.scale * dot(q, k, s.head_dim);
        if (in.softcap > 0) score = in.softcap * std::tanh(score / in.softcap);
        const double p = std::exp(score - lse[row]);
        const double ds = p * (dot(do_row, v, s.head_dim) - delta[row]) * softcap_slope(in, score);
        for (int64_t d = 0; d < s.head_dim; ++d) {
          dv_row[d] += p * do_row[d];
          dk_row[d] += in.scale * ds * q[d];
        }
      }
    }
  }
}

}  // namespace a2d::reference
