// Internal: the table of algorithms. One entry per algorithm, each defined in its own file of this
// folder (attention2d.cpp holds ATTENTION2D and its overlapped variant): its name, what its plans
// choose (AlgorithmTraits), its default plan and checks, its factory, and its part of the cost
// model. Everything else (plan.cpp's default_plan, check_plan and make_attention, relayout.cpp's
// plan_layout, the model in src/model/, the programs' tables) reads the entry and never asks
// which algorithm a plan has. Adding an algorithm: its enum value (attention.hpp), its file here,
// its line in table.cpp's list.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "attention2d/attention.hpp"
#include "attention2d/cost_model.hpp"
#include "model/model_internal.hpp"

namespace a2d {

struct AlgorithmEntry {
  AlgorithmTraits traits;

  // ---- Plans ----------------------------------------------------------------------------------
  // The grid, layout (and U) of the plan when only the algorithm is chosen.
  void (*default_plan)(Plan& plan, const Problem& problem, int ranks) = nullptr;
  // Throws unless the plan can run the problem on `ranks` ranks (after the checks every plan
  // has: threads, stripe, U = 1 unless traits.heads_parallel).
  void (*check)(const Plan& plan, const Problem& problem, int ranks) = nullptr;
  std::unique_ptr<DistributedAttention> (*make)(const Problem& problem, const Plan& plan,
                                                Communicator& world, Backend& backend) = nullptr;
  // Appends the plans a search, benchmark or balance report tries (algorithm_plans).
  void (*plans)(std::vector<Plan>& out, const Problem& problem, int ranks,
                const PlanChoices& choices) = nullptr;

  // ---- Model ----------------------------------------------------------------------------------
  // Modelled whole as another plan on a group problem (the hybrid: ATTENTION2D on each heads
  // group, which FLOPs, reordering and kernel tiles are those of): these three, or all null.
  Problem (*group_problem)(const Problem& problem, const Plan& plan) = nullptr;
  Plan (*group_plan)(const Plan& plan) = nullptr;
  int (*group_rank)(const Plan& plan, int rank) = nullptr;  // the rank inside its group
  // The whole prediction, where the algorithm composes it itself (null: predict's phases, the
  // critical path and memory below).
  Prediction (*predict)(const Problem& problem, const Plan& plan, const Machine& machine,
                        int ranks_per_node) = nullptr;

  // Bytes and messages `rank` sends, per phase (predict_traffic; model.hpp).
  std::map<std::string, Traffic> (*traffic)(const Problem& problem, const Plan& plan,
                                            int rank) = nullptr;
  // The communicator of a phase (by the phase's name after "forward." or "backward."); null: the
  // world.
  model::Group (*phase_group)(const std::string& step) = nullptr;
  // Whether a phase blocks (a collective, or an exchange waited for with nothing to compute), so
  // costs the machine's synchronisation once; null: every phase does.
  bool (*blocking)(const std::string& step) = nullptr;
  // Forward and backward seconds from the phases' and the kernel's.
  model::CriticalPath (*critical_path)(const model::PhaseTimes& times) = nullptr;

  // Unmasked forward FLOPs of `rank` in closed form (rank_forward_flops).
  double (*rank_flops)(const Problem& problem, const Plan& plan, int rank) = nullptr;
  // The ranks whose FLOPs are evaluated for the busiest (null: every P/128-th and the last).
  std::vector<int> (*flops_sample)(const Plan& plan) = nullptr;
  // A lower bound of the busiest rank's FLOPs beyond any single rank's (null: none).
  double (*critical_flops)(const Problem& problem, const Plan& plan) = nullptr;

  // The whole memory per rank, where the algorithm composes it itself (the hybrid; null: the
  // shards and `memory`'s transient buffers).
  double (*memory_bytes)(const Problem& problem, const Plan& plan, bool with_backward) = nullptr;
  // The busiest rank's transient buffers, forward and backward.
  model::Transient (*memory)(const Problem& problem, const Plan& plan,
                             const model::MemoryTerms& terms) = nullptr;
  // Bytes the busiest rank reorders in place under a causal or document mask on more than one
  // rank (null: none).
  double (*permuted_bytes)(const Problem& problem, const Plan& plan, bool forward) = nullptr;

  // The kernel calls of `rank` (`parts`: sequence_parts of the plan where calls_need_parts).
  model::Calls (*kernel_calls)(const Problem& problem, const Plan& plan, const SequenceParts& parts,
                               int rank, bool backward) = nullptr;
  bool calls_need_parts = false;
  // The backward makes other calls than the forward (kernel_calls with backward = true).
  bool backward_calls_differ = false;
  // Each rank's calls cover the whole sequence (on its heads), not 1/P of it.
  bool whole_sequence_calls = false;
};

const AlgorithmEntry& algorithm_entry(Algorithm algorithm);
// Every entry, in the order of the enum.
const std::vector<const AlgorithmEntry*>& algorithm_entries();

// The entries, each in its file.
const AlgorithmEntry& attention2d_entry();
const AlgorithmEntry& attention2d_overlap_entry();
const AlgorithmEntry& ring_entry();
const AlgorithmEntry& allgather_kv_entry();
const AlgorithmEntry& ulysses_entry();
const AlgorithmEntry& hybrid_entry();

// The plans of a 1 x P algorithm (Ring Attention, all-gather K/V, Ulysses): one per chosen layout,
// or the default plan and, with the caller's shards cut evenly, the plan in their layout.
void sequence_plans(std::vector<Plan>& out, Algorithm algorithm, const Problem& problem, int ranks,
                    const PlanChoices& choices);

// Checks the entries share.
// ATTENTION2D and the hybrid: the shards are cyclic.
void require_cyclic_layout(const Plan& plan);
// The 1 x P algorithms: all ranks in one group.
void require_one_group(const Plan& plan, int ranks);

}  // namespace a2d
