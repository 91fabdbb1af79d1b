// Grid shapes and coordinates (grid_shape.hpp): pure arithmetic.
#include "attention2d/grid_shape.hpp"

#include <sstream>
#include <string>
#include <vector>

#include "attention2d/error.hpp"

namespace a2d {

GridShape parse_grid(const std::string& text) {
  const auto x = text.find_first_of("xX");
  int rows = 0, cols = 0;
  bool ok = x != std::string::npos && x > 0 && x + 1 < text.size();
  if (ok) {
    try {
      size_t used_r = 0, used_c = 0;
      rows = std::stoi(text.substr(0, x), &used_r);
      cols = std::stoi(text.substr(x + 1), &used_c);
      ok = used_r == x && used_c == text.size() - x - 1;
    } catch (const std::exception&) {
      ok = false;
    }
  }
  A2D_REQUIRE(ok && rows >= 1 && cols >= 1, "cannot read the grid '", text,
              "'; write it as RxC with positive R and C, e.g. 4x4 or 2x8");
  return {rows, cols};
}

std::vector<GridShape> grid_shapes(int ranks) {
  A2D_REQUIRE(ranks >= 1, "a grid needs at least one rank (got ", ranks, ")");
  std::vector<GridShape> shapes;
  for (int rows = 1; rows <= ranks; ++rows) {
    if (ranks % rows == 0) shapes.push_back({rows, ranks / rows});
  }
  return shapes;
}

GridShape default_grid(int ranks) {
  GridShape best{1, ranks};
  for (const GridShape& shape : grid_shapes(ranks)) {
    if (shape.rows <= shape.cols) best = shape;  // the last one with R <= C is the squarest
  }
  return best;
}

void check_grid(const GridShape& shape, int ranks) {
  if (shape.rows >= 1 && shape.cols >= 1 && shape.size() == ranks) return;
  std::ostringstream valid;
  for (const GridShape& s : grid_shapes(ranks))
    valid << " " << s.describe();
  A2D_FAIL("the grid ", shape.describe(), " has ", shape.size(), " places but the job has ", ranks,
           " ranks; use one of:", valid.str());
}

int GridCoords::kv_source_rank() const {
  // After the transpose p(r, c) holds the K/V of cyclic part r * C + c, which lives on the rank
  // with that world (column-major) index.
  return row_major();
}

int GridCoords::kv_dest_rank() const {
  // This rank's cyclic part q = rank goes to the p(r', c') with r' * C + c' = q.
  const int r = rank / shape.cols, c = rank % shape.cols;
  return rank_of(shape, r, c);
}

}  // namespace a2d
