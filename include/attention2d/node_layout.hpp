// How the launcher placed the job's ranks on nodes, read from its environment: Slurm's (srun,
// sbatch) or Open MPI's (mpirun). The planner uses it as it uses a machine file's ranks_per_node
// (an explicit --machine-file wins), so a job under Slurm is planned for its nodes without a file.
//
// Slurm's forms, as srun sets them for a step of 4 nodes x 2 tasks:
//   SLURM_STEP_NUM_NODES=4  SLURM_STEP_TASKS_PER_NODE=2(x4)  SLURM_STEP_NODELIST=h[0-3]
//   SLURM_NODEID=1  SLURM_LOCALID=0  (this task: node 1 of the step, its first task there)
// (the job's SLURM_NNODES, SLURM_TASKS_PER_NODE, SLURM_JOB_NODELIST where there is no step: in
// an sbatch script). SLURM_TASKS_PER_NODE lists counts in node order, a run of equal counts
// written N(xM): "3,2(x2)" is 3 tasks on the first node and 2 on each of the next two.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace a2d {

struct NodeLayout {
  // Where it was read: "slurm" or "open mpi".
  std::string source;
  // Tasks (ranks) of each node, in node order; its size is the number of nodes.
  std::vector<int> tasks_per_node;
  // The nodes' names where the launcher gives them (Slurm), else empty.
  std::vector<std::string> node_names;
  // Rank q on node q mod nodes (srun --distribution=cyclic) rather than consecutive ranks
  // sharing a node (block, the default of srun and mpirun).
  bool cyclic = false;
  // This process's node and its index among that node's tasks; -1 where not given.
  int node_id = -1;
  int local_id = -1;

  int nodes() const { return static_cast<int>(tasks_per_node.size()); }
  int ranks() const;
  // The tasks of every node where all nodes have the same number, else 0.
  int uniform_tasks_per_node() const;
  // "4 nodes x 2 tasks (slurm: h[0-3]), block placement"
  std::string describe() const;
};

// "2(x4)" -> {2, 2, 2, 2}; "3,2(x2)" -> {3, 2, 2}; "1" -> {1}. Throws a2d::Error naming the text
// on anything else (empty items, zero counts, "2(x0)", "2(4)", trailing characters).
std::vector<int> parse_slurm_tasks_per_node(const std::string& text);

// A Slurm host list expanded, in order: "h[0-3],login" -> h0 h1 h2 h3 login; zero-padded ranges
// keep their width ("n[08-10]" -> n08 n09 n10); several bracket groups multiply
// ("r[1-2]n[1-2]" -> r1n1 r1n2 r2n1 r2n2). Throws a2d::Error on unbalanced brackets, empty
// names, descending or malformed ranges, or more than 1,000,000 names.
std::vector<std::string> expand_slurm_node_list(const std::string& text);

// Looks up an environment variable; nullptr where it is not set.
using EnvironmentLookup = std::function<const char*(const char*)>;

// The launcher's layout from the environment: Open MPI's where mpirun started the process
// (OMPI_COMM_WORLD_SIZE and OMPI_COMM_WORLD_LOCAL_SIZE: nodes of LOCAL_SIZE ranks, block), else
// Slurm's (the step's variables where set, else the job's), else nullopt. Throws a2d::Error,
// naming the variable, where a variable is malformed or they disagree (the node count of the
// task list differs from SLURM_NNODES, or the node list names another number of nodes).
std::optional<NodeLayout> read_node_layout(const EnvironmentLookup& lookup);
// The same, from this process's environment.
std::optional<NodeLayout> read_node_layout();

}  // namespace a2d
