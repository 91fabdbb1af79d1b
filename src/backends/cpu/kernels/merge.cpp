// Merging partial attention results (the paper's ATTNFIX) and the backward's delta.
//
//   M = max(M1, M2), E1 = exp(M1 - M), E2 = exp(M2 - M)
//   acc = E1 acc1 + E2 acc2,  sum = E1 sum1 + E2 sum2
// An empty side has M = -inf and sum = 0; its weight is defined as 0 (never exp(-inf + inf)).
// The partial state and LSE are fp32; O (finalize_partial) and the delta's O and dO may be of any
// DType.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention2d/kernel.hpp"
#include "backends/cpu/kernels/cpu_kernels.hpp"

namespace a2d {
namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// exp(m - m_max), with an empty side (m = -inf) weighing nothing.
float weight(float m, float m_max) {
  return m == kNegInf ? 0.0f : std::exp(m - m_max);
}
}  // namespace

void merge_partial(const RowsShape& rows, const PartialView& into, const ConstPartialView& from) {
  for (int64_t b = 0; b < rows.batch; ++b) {
    for (int64_t h = 0; h < rows.heads; ++h) {
      for (int64_t t = 0; t < rows.tokens; ++t) {
        const float m_from = from.row_max.at(b, h, t);
        if (m_from == kNegInf) continue;  // nothing to add
        float& m_into = into.row_max.at(b, h, t);
        const float m = max_keep_nan(m_into, m_from);
        const float w_into = weight(m_into, m);
        const float w_from = std::exp(m_from - m);
        into.row_sum.at(b, h, t) =
            w_into * into.row_sum.at(b, h, t) + w_from * from.row_sum.at(b, h, t);
        float* acc = into.acc.at(b, t, h);
        const float* other = from.acc.at(b, t, h);
        for (int64_t d = 0; d < rows.head_dim; ++d)
          acc[d] = w_into * acc[d] + w_from * other[d];
        m_into = m;
      }
    }
  }
}

void merge_partial_records(float* into, const float* from, int64_t count, int64_t record) {
  const RowsShape rows{1, count, 1, record - 2};
  const PartialView into_view{
      {into + 2, 0, record, 0}, {into, 0, 0, record}, {into + 1, 0, 0, record}};
  const ConstPartialView from_view{
      {from + 2, 0, record, 0}, {from, 0, 0, record}, {from + 1, 0, 0, record}};
  merge_partial(rows, into_view, from_view);
}

void finalize_partial(const RowsShape& rows, const ConstPartialView& partial, OutTokens out,
                      RowView<float> lse) {
  // An fp32 O is written in place; any other is computed into one fp32 row and rounded once,
  // at the store.
  const bool in_place = out.dtype == DType::f32;
  std::vector<float> row(in_place ? 0 : static_cast<size_t>(rows.head_dim));
  for (int64_t b = 0; b < rows.batch; ++b) {
    for (int64_t h = 0; h < rows.heads; ++h) {
      for (int64_t t = 0; t < rows.tokens; ++t) {
        const float sum = partial.row_sum.at(b, h, t);
        float* o = in_place ? out.floats().at(b, t, h) : row.data();
        if (sum == 0.0f || partial.row_max.at(b, h, t) == kNegInf) {
          for (int64_t d = 0; d < rows.head_dim; ++d)
            o[d] = 0.0f;
          lse.at(b, h, t) = kNegInf;
        } else {
          const float inverse = 1.0f / sum;
          const float* acc = partial.acc.at(b, t, h);
          for (int64_t d = 0; d < rows.head_dim; ++d)
            o[d] = acc[d] * inverse;
          lse.at(b, h, t) = partial.row_max.at(b, h, t) + std::log(sum);
        }
        if (!in_place) store_row(o, rows.head_dim, out.at(b, t, h), out.dtype);
      }
    }
  }
}

void merge_output(const RowsShape& rows, TokenView<float> out_a, RowView<float> lse_a,
                  TokenView<const float> out_b, RowView<const float> lse_b) {
  for (int64_t b = 0; b < rows.batch; ++b) {
    for (int64_t h = 0; h < rows.heads; ++h) {
      for (int64_t t = 0; t < rows.tokens; ++t) {
        const float l_b = lse_b.at(b, h, t);
        if (l_b == kNegInf) continue;
        float& l_a = lse_a.at(b, h, t);
        const float m = max_keep_nan(l_a, l_b);
        const float w_a = weight(l_a, m);
        const float w_b = std::exp(l_b - m);
        const float total = w_a + w_b;  // >= 1: the larger side has weight 1
        float* o = out_a.at(b, t, h);
        const float* other = out_b.at(b, t, h);
        for (int64_t d = 0; d < rows.head_dim; ++d)
          o[d] = (w_a * o[d] + w_b * other[d]) / total;
        l_a = m + std::log(total);
      }
    }
  }
}

void compute_delta(const RowsShape& rows, InTokens out, InTokens d_out, RowView<float> delta) {
  // fp32 rows are read in place, others converted (exactly) into one fp32 row each.
  std::vector<float> o_row(out.dtype == DType::f32 ? 0 : static_cast<size_t>(rows.head_dim));
  std::vector<float> g_row(d_out.dtype == DType::f32 ? 0 : static_cast<size_t>(rows.head_dim));
  auto row_of = [&](InTokens x, std::vector<float>& scratch, int64_t b, int64_t t, int64_t h) {
    if (x.dtype == DType::f32) return x.floats().at(b, t, h);
    load_row(x.at(b, t, h), x.dtype, rows.head_dim, scratch.data());
    return static_cast<const float*>(scratch.data());
  };
  for (int64_t b = 0; b < rows.batch; ++b) {
    for (int64_t t = 0; t < rows.tokens; ++t) {
      for (int64_t h = 0; h < rows.heads; ++h) {
        const float* o = row_of(out, o_row, b, t, h);
        const float* g = row_of(d_out, g_row, b, t, h);
        double sum = 0.0;  // head_dim terms, accumulated wide: this feeds every dS of the row
        for (int64_t d = 0; d < rows.head_dim; ++d)
          sum += static_cast<double>(o[d]) * g[d];
        delta.at(b, h, t) = static_cast<float>(sum);
      }
    }
  }
}

void add_sinks(const RowsShape& rows, const float* sinks, int64_t first_head, OutTokens out,
               RowView<float> lse) {
  std::vector<float> row(static_cast<size_t>(rows.head_dim));
  for (int64_t b = 0; b < rows.batch; ++b) {
    for (int64_t h = 0; h < rows.heads; ++h) {
      const double sink = sinks[first_head + h];
      for (int64_t t = 0; t < rows.tokens; ++t) {
        float& row_lse = lse.at(b, h, t);
        const double old_lse = row_lse;
        // logaddexp in double: the factor exp(LSE - LSE') is in [0, 1] and exact to fp64.
        const double high = std::max(old_lse, sink);
        const double new_lse =
            old_lse == -std::numeric_limits<double>::infinity()
                ? sink
                : high + std::log(std::exp(old_lse - high) + std::exp(sink - high));
        const float factor = static_cast<float>(std::exp(old_lse - new_lse));
        row_lse = static_cast<float>(new_lse);
        std::byte* o = out.at(b, t, h);
        load_row(o, out.dtype, rows.head_dim, row.data(), factor);
        store_row(row.data(), rows.head_dim, o, out.dtype);
      }
    }
  }
}

void add_sink_gradient(const RowsShape& rows, const float* sinks, int64_t first_head,
                       RowView<const float> lse, RowView<const float> delta, double* dsink) {
  for (int64_t b = 0; b < rows.batch; ++b) {
    for (int64_t h = 0; h < rows.heads; ++h) {
      const double sink = sinks[first_head + h];
      double sum = 0.0;
      for (int64_t t = 0; t < rows.tokens; ++t) {
        sum += std::exp(sink - static_cast<double>(lse.at(b, h, t))) * delta.at(b, h, t);
      }
      dsink[h] -= sum;
    }
  }
}

}  // namespace a2d
