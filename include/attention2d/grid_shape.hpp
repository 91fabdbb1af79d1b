// attention2d: the shape R x C of a process grid and a rank's coordinates in it, plain values
// (grid.hpp: the Grid that owns the communicators; its comment gives the rank order with a worked
// example). The ground floor (tests/layers/check_layers.py).
#pragma once

#include <string>
#include <vector>

namespace a2d {

struct GridShape {
  int rows = 1;
  int cols = 1;
  int size() const { return rows * cols; }
  std::string describe() const { return std::to_string(rows) + "x" + std::to_string(cols); }
};

// "RxC" -> GridShape; throws a2d::Error for anything else.
GridShape parse_grid(const std::string& text);
// Every factorisation R x C of P, in increasing R (1 x P first, P x 1 last).
std::vector<GridShape> grid_shapes(int ranks);
// The most square factorisation, with R <= C.
GridShape default_grid(int ranks);
// Throws unless shape.rows * shape.cols == ranks, with a message naming valid shapes.
void check_grid(const GridShape& shape, int ranks);

// Coordinates in a grid: pure arithmetic, used by the algorithms and by the cost model.
struct GridCoords {
  GridShape shape;
  int rank = 0;
  int row() const { return rank % shape.rows; }
  int col() const { return rank / shape.rows; }
  static int rank_of(const GridShape& shape, int row, int col) { return row + col * shape.rows; }
  // Row-major index r * C + c: the cyclic part whose K/V the transposed layout puts here.
  int row_major() const { return row() * shape.cols + col(); }
  // The rank that holds (before the transpose) the K/V this rank holds after it, and the rank
  // this rank's K/V go to. On a square grid both are p(c, r).
  int kv_source_rank() const;
  int kv_dest_rank() const;
};

}  // namespace a2d
