// attention2d: how to distribute a problem, a plain value: the algorithm, the grid, the token
// layout, the kernel threads, and the table's traits of each algorithm.
//
// The ground floor (tests/layers/check_layers.py): values only. default_plan, check_plan and
// algorithm_plans are implemented from the table of algorithms (src/table/plan.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attention2d/grid_shape.hpp"
#include "attention2d/layout.hpp"
#include "attention2d/problem.hpp"

namespace a2d {

struct UserShards;  // relayout.hpp

enum class Algorithm { attention2d, attention2d_overlap, ring, allgather_kv, ulysses, hybrid };

Algorithm parse_algorithm(const std::string& name);  // throws a2d::Error naming the choices
std::string algorithm_name(Algorithm algorithm);

struct Plan {
  Algorithm algorithm = Algorithm::attention2d;
  GridShape grid;                          // ATTENTION2D: R x C; hybrid: R x C of each heads
                                           // group; other algorithms: 1 x P
  LayoutKind layout = LayoutKind::cyclic;  // the shard layout of Q, K, V, O (and gradients)
  int64_t stripe = 1;                      // stripe width of the striped layout
  // ATTENTION2D: exchange K/V into the paper's row-major cyclic layout before the column
  // gathers (true), or gather K/V where they already are (false, one exchange less; see
  // docs/attention2d.md).
  bool kv_transpose = true;
  int threads = 1;  // kernel threads per rank
  // Hybrid: U, the ranks of each heads all-to-all (P = U x R x C; docs/attention2d.md,
  // "Heads x ATTENTION2D"); 1 for every other algorithm.
  int heads_parallel = 1;

  // The ranks the plan runs on: U x R x C for the hybrid, R x C (1 x P for the baselines) else.
  int ranks() const { return heads_parallel * grid.size(); }
  std::string describe() const;
};

// The table of algorithms (src/table/, one file per algorithm): what a plan of each chooses.
struct AlgorithmTraits {
  Algorithm algorithm = Algorithm::attention2d;
  const char* name = "";  // as --algo spells it
  // The plan's grid is R x C of its choosing, and the K/V transpose applies (else: 1 x P).
  bool grid = false;
  // The plan's heads_parallel U applies (P = U x R x C; else 1).
  bool heads_parallel = false;
  // The shards are cyclic whatever Plan::layout says (else: the plan's layout, any of them).
  bool cyclic_only = false;
};
const AlgorithmTraits& algorithm_traits(Algorithm algorithm);
// Every algorithm, in the table's order (the order of the enum).
std::vector<Algorithm> all_algorithms();
// Their names, as --algo spells them, in the same order.
std::vector<std::string> algorithm_names();
// Those names as one line of text, joined by `separator` and the last two by `last_separator`:
// algorithm_list(",") = "attention2d,attention2d-overlap,...", algorithm_list(", ", " or ") =
// "attention2d, attention2d-overlap, ... or hybrid".
std::string algorithm_list(const std::string& separator, const std::string& last_separator = "");

// The plan's shape as the programs' tables print it: "U2 1x2", "2x2" (each followed by
// `no_transpose` without the K/V transpose) or the layout's name, per what the algorithm uses.
std::string plan_shape(const Plan& plan, const std::string& no_transpose);
// The options of a2d run that give the plan's shape: " --grid 2x2 --no-kv-transpose",
// " --layout striped --stripe 4", " --heads-parallel 2 --grid 1x2".
std::string plan_options(const Plan& plan);

// Which plans of an algorithm a search, a benchmark or a balance report tries.
struct PlanChoices {
  // Grid algorithms: this grid only (else every grid of P), and each grid also without the K/V
  // transpose.
  const GridShape* grid = nullptr;
  bool both_kv_transposes = false;
  // 1 x P algorithms: one plan per layout (none: the default layout), and with `shards` (an even
  // cut) also the caller's layout.
  std::vector<LayoutKind> layouts;
  const UserShards* shards = nullptr;
  // Heads-parallel algorithms: this U only (0: every U > 1 dividing P; 1: U = 1 on `grid` or the
  // default grid).
  int heads_parallel = 0;
};
// Default plans of `algorithm` varied as `choices` say, in a fixed order; check_plan is not
// applied (a plan may still be one the problem does not allow).
std::vector<Plan> algorithm_plans(Algorithm algorithm, const Problem& problem, int ranks,
                                  const PlanChoices& choices);

// The plan an algorithm uses when only the algorithm is chosen: ATTENTION2D on the most square
// grid with the cyclic layout; Ring with zigzag (causal) or contiguous; and so on.
Plan default_plan(Algorithm algorithm, const Problem& problem, int ranks);
// Throws unless the plan can run `problem` on `ranks` ranks (grid size, layout allowed for the
// algorithm, Ulysses head divisibility), with a message saying what to change.
void check_plan(const Plan& plan, const Problem& problem, int ranks);

}  // namespace a2d
