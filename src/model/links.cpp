// The links of the cost model (links.hpp, cost_model.hpp's shared_link_load): the communicator
// of each phase and the nodes and shared links its traffic crosses.
#include "model/links.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "attention2d/error.hpp"
#include "attention2d/grid.hpp"
#include "table/table.hpp"

namespace a2d {
namespace model {

Group group_of(const Plan& plan, const std::string& phase) {
  const AlgorithmEntry& entry = algorithm_entry(plan.algorithm);
  return entry.phase_group ? entry.phase_group(phase.substr(phase.find('.') + 1)) : Group::world;
}

bool blocking_phase(const Plan& plan, const std::string& phase) {
  const AlgorithmEntry& entry = algorithm_entry(plan.algorithm);
  return entry.blocking ? entry.blocking(phase.substr(phase.find('.') + 1)) : true;
}

double reduction_bytes_per_s(const Machine& machine, const std::string& phase) {
  const std::string step = phase.substr(phase.find('.') + 1);
  if (step == "merge_reduce_scatter" || step == "partial_ring") return machine.merge_bytes_per_s;
  if (step == "dq_reduce_scatter" || step == "dkv_reduce_scatter" || step == "dq_ring" ||
      step == "dkv_ring") {
    return machine.sum_bytes_per_s;
  }
  return 0;
}

bool crosses_nodes(const Plan& plan, Group group, const NodeOf& node) {
  const int ranks = plan.grid.size(), rows = plan.grid.rows, cols = plan.grid.cols;
  switch (group) {
    case Group::world:
      for (int rank = 1; rank < ranks; ++rank)
        if (node(rank) != node(0)) return true;
      return false;
    case Group::row:
      for (int r = 0; r < rows; ++r) {
        for (int c = 1; c < cols; ++c)
          if (node(GridCoords::rank_of(plan.grid, r, c)) != node(r)) return true;
      }
      return false;
    case Group::column:
      for (int c = 0; c < cols; ++c) {
        for (int r = 1; r < rows; ++r)
          if (node(GridCoords::rank_of(plan.grid, r, c)) != node(c * rows)) return true;
      }
      return false;
    case Group::pair:
      for (int rank = 0; rank < ranks; ++rank) {
        if (node(rank) != node(GridCoords{plan.grid, rank}.kv_dest_rank())) return true;
      }
      return false;
  }
  return true;
}

double all_to_all_link_load(int ranks, int ranks_per_node, bool cyclic_placement) {
  const NodeOf node(ranks, ranks_per_node, cyclic_placement);
  double most = 0;
  std::vector<int> members(static_cast<size_t>(node.nodes), 0);
  for (int rank = 0; rank < ranks; ++rank)
    ++members[static_cast<size_t>(node(rank))];
  for (const int count : members) {
    const double local = count;
    if (ranks > 1) most = std::max(most, local * (ranks - local) / (ranks - 1));
  }
  return most;
}

}  // namespace model

using model::all_to_all_link_load;
using model::Group;
using model::group_of;
using model::NodeOf;

double shared_link_load(const Plan& plan, const std::string& phase, int ranks_per_node,
                        bool cyclic_placement) {
  A2D_REQUIRE(ranks_per_node >= 1, "ranks per node must be at least 1");
  const int ranks = plan.grid.size(), rows = plan.grid.rows, cols = plan.grid.cols;
  const NodeOf node(ranks, ranks_per_node, cyclic_placement);
  const int nodes = node.nodes;
  const std::string step = phase.substr(phase.find('.') + 1);
  if (step.find("all_to_all") != std::string::npos)
    return all_to_all_link_load(ranks, ranks_per_node, cyclic_placement);
  // The rank each rank sends to: its ring successor in the phase's communicator, or its
  // transpose partner. Over a union of cycles as many sends leave a node as enter it, so the
  // count is the same for either direction.
  const Group group = group_of(plan, phase);
  const auto successor = [&](int rank) {
    const GridCoords at{plan.grid, rank};
    switch (group) {
      case Group::world:
        return (rank + 1) % ranks;
      case Group::row:
        return GridCoords::rank_of(plan.grid, at.row(), (at.col() + 1) % cols);
      case Group::column:
        return GridCoords::rank_of(plan.grid, (at.row() + 1) % rows, at.col());
      case Group::pair:
        return at.kv_dest_rank();
    }
    return rank;
  };
  std::vector<int> leaving(static_cast<size_t>(nodes), 0);
  for (int rank = 0; rank < ranks; ++rank) {
    if (node(successor(rank)) != node(rank)) ++leaving[static_cast<size_t>(node(rank))];
  }
  return *std::max_element(leaving.begin(), leaving.end());
}

}  // namespace a2d
