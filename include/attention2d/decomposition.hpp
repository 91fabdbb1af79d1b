// attention2d: what each rank of a plan holds, gathers and computes. Pure functions of
// (problem, plan, rank) with no communication, shared by the algorithms (which run them), the
// cost model (which counts them) and the tests (which check balance over thousands of virtual
// ranks).
#pragma once

#include <cstdint>
#include <vector>

#include "attention2d/attention.hpp"

namespace a2d {

// One rank of an ATTENTION2D plan (both variants). Parts are cyclic parts = world ranks.
struct Attention2DRank {
  int rank = 0;
  int row = 0;
  int col = 0;
  int64_t own_tokens = 0;
  std::vector<int> row_parts;        // Q parts gathered along the row, in row order (by column)
  std::vector<int> col_parts;        // K/V parts gathered along the column, in column order
  std::vector<int64_t> row_counts;   // their token counts
  std::vector<int64_t> col_counts;
  std::vector<int64_t> q_positions;  // global positions of the gathered query rows (N/R)
  std::vector<int64_t> kv_positions; // ... and of the gathered key rows (N/C)
  int kv_source = 0;  // world rank whose K/V this rank holds after the transpose
  int kv_dest = 0;    // world rank that holds this rank's K/V after the transpose

  int64_t q_rows() const;
  int64_t kv_rows() const;
};

Attention2DRank attention2d_rank(const Problem& problem, const Plan& plan, int rank);

// Unmasked (query, key) score entries a rank computes, per batch and head: the load-balance
// measure of docs/attention2d.md.
int64_t attention2d_unmasked_pairs(const Problem& problem, const Plan& plan, int rank);

}  // namespace a2d
