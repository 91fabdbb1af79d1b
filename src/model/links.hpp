// Internal: the communicators the cost model's phases use and the links they cross (links.cpp):
// which group a phase runs in, whether it blocks, what it reduces, whether a group spans nodes,
// and how many ranks' traffic a node's shared link carries.
#pragma once

#include <string>

#include "attention2d/cost_model.hpp"
#include "model/model_internal.hpp"

namespace a2d::model {

// Which communicator a phase uses, from its name (the algorithms' phase names).
Group group_of(const Plan& plan, const std::string& phase);

// Whether the phase is a blocking operation (a collective, or an exchange the rank waits for
// with nothing to compute meanwhile), which costs the machine's synchronisation once; the ring
// phases of Ring Attention and ATTENTION2D-O move while the ranks compute.
bool blocking_phase(const Plan& plan, const std::string& phase);

// The rate at which a phase reduces what it receives (0: it reduces nothing, or the machine does
// not charge it): partial attention results are merged, gradients summed.
double reduction_bytes_per_s(const Machine& machine, const std::string& phase);

// The node of world rank q: q / G with consecutive ranks per node (block placement), or q mod
// (number of nodes) when the launcher deals ranks out to nodes in turn (cyclic placement,
// mpirun --map-by node).
struct NodeOf {
  int ranks_per_node = 1;
  int nodes = 1;
  bool cyclic = false;
  NodeOf(int ranks, int per_node, bool cyclic_placement)
      : ranks_per_node(per_node),
        nodes((ranks + per_node - 1) / per_node),
        cyclic(cyclic_placement) {}
  int operator()(int rank) const { return cyclic ? rank % nodes : rank / ranks_per_node; }
};

// Whether some rank's `group` spans two nodes.
bool crosses_nodes(const Plan& plan, Group group, const NodeOf& node);

// An all-to-all over `ranks` world ranks: every rank sends to every other alike, so a node's link
// carries its ranks' off-node share, G·(P − G)/(P − 1) of a rank's bytes for a node of G ranks.
double all_to_all_link_load(int ranks, int ranks_per_node, bool cyclic_placement);

}  // namespace a2d::model
