// The Grid: the world, row and column communicators of an R x C grid (grid.hpp; its shape
// and coordinates, plain values: src/core/grid_shape.cpp).
#include "attention2d/grid.hpp"

#include <sstream>

#include "attention2d/error.hpp"

namespace a2d {

Grid::Grid(std::unique_ptr<Communicator> world, GridShape shape)
    : shape_(shape), world_(std::move(world)) {
  A2D_REQUIRE(world_, "a grid needs a communicator");
  check_grid(shape_, world_->size());
  const GridCoords at = coords();
  row_comm_ = world_->split(at.row(), at.col());
  col_comm_ = world_->split(at.shape.rows + at.col(), at.row());
}

std::string Grid::describe() const {
  std::ostringstream out;
  out << shape_.describe() << " grid, rank " << rank() << " at (row " << row() << ", col " << col()
      << ")";
  return out.str();
}

}  // namespace a2d
