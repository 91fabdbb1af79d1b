// attention2d: the R x C process grid.
//
// P = R * C ranks. World rank q sits at row r = q mod R, column c = q / R (column-major rank
// order, as in the paper), so consecutive ranks (often one node) fill a column first.
//
//   * row r     = the C ranks with the same queries: their Q shards are gathered along the row
//                 (tokens t with t mod R == r) and their partial outputs merged along it;
//   * column c  = the R ranks with the same keys: their K/V shards are gathered along the column.
//
// Worked example, P = 6 as a 2 x 3 grid (R = 2 rows, C = 3 columns), world ranks:
//
//              c=0   c=1   c=2
//      r=0      0     2     4        row 0: ranks 0 2 4 gather Q tokens t = 0, 2, 4, ... (mod 2)
//      r=1      1     3     5        row 1: ranks 1 3 5 gather Q tokens t = 1, 3, 5, ...
//
// Column 0 (ranks 0 and 1) gathers the keys of column 0. The K/V transpose partner of p(r, c)
// is the rank that owns the K/V residue class the transposed layout puts on p(r, c); see
// kv_source_rank() and kv_dest_rank().
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "attention2d/comm.hpp"
#include "attention2d/grid_shape.hpp"

namespace a2d {

// Owns the world, row and column communicators of one grid. Not copyable.
class Grid {
 public:
  // Collective over `world`. rows * cols must equal world->size().
  Grid(std::unique_ptr<Communicator> world, GridShape shape);
  Grid(const Grid&) = delete;
  Grid& operator=(const Grid&) = delete;

  const GridShape& shape() const { return shape_; }
  GridCoords coords() const { return {shape_, world_->rank()}; }
  int rank() const { return world_->rank(); }
  int size() const { return world_->size(); }
  int row() const { return coords().row(); }
  int col() const { return coords().col(); }

  Communicator& world() { return *world_; }
  Communicator& row_comm() { return *row_comm_; }  // ranks of this row, ordered by column
  Communicator& col_comm() { return *col_comm_; }  // ranks of this column, ordered by row

  std::string describe() const;

 private:
  GridShape shape_;
  std::unique_ptr<Communicator> world_;
  std::unique_ptr<Communicator> row_comm_;
  std::unique_ptr<Communicator> col_comm_;
};

}  // namespace a2d
