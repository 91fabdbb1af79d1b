// Helpers of the cost model's tests (test_cost_model_*.cpp).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>

#include "attention2d/cost_model.hpp"
#include "attention2d/error.hpp"

namespace a2d::cost_model_case {

inline Problem problem_of(int64_t seq, Mask mask, int64_t heads = 4, int64_t kv_heads = 2) {
  Problem p;
  p.batch = 2;
  p.seq = seq;
  p.heads = heads;
  p.kv_heads = kv_heads;
  p.head_dim = 8;
  p.mask = mask;
  return p;
}

// A machine whose ranks share one core (no overlap), with round numbers.
inline Machine shared_machine() {
  Machine m;
  m.name = "test";
  m.kernel_forward_flops = m.kernel_backward_flops = 1e9;
  m.intra = m.inter = Link{1e-6, 1e9};
  m.shared_cores = 1;
  return m;
}

inline GridShape grid_of(int rows, int cols) {
  for (const GridShape& shape : grid_shapes(rows * cols))
    if (shape.rows == rows && shape.cols == cols) return shape;
  ADD_FAILURE() << "no grid " << rows << "x" << cols;
  return {};
}

// The message of the a2d::Error `body` throws ("" when it throws none).
inline std::string error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

}  // namespace a2d::cost_model_case
