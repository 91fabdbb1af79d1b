// A Problem from its sizes and mask, for the tests (unit and MPI) that build many.
#pragma once

#include <cstdint>

#include "attention2d/attention.hpp"

namespace a2d::test {

inline Problem make_problem(int64_t batch, int64_t heads, int64_t kv_heads, int64_t seq,
                            int64_t dim, Mask mask) {
  return Problem{.batch = batch,
                 .heads = heads,
                 .kv_heads = kv_heads,
                 .seq = seq,
                 .head_dim = dim,
                 .mask = mask};
}

}  // namespace a2d::test
