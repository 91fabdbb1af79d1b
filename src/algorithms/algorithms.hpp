// Internal: constructors of the distributed algorithms.
#pragma once

#include <memory>

#include "attention2d/attention.hpp"
#include "attention2d/decomposition.hpp"

namespace a2d::algorithms {

// What the sequence-parallel algorithms (Ring Attention, all-gather K/V, Ulysses) share: all
// ranks in one group (a private copy of the world, so their messages never mix with the
// caller's) and the shards in the plan's layout.
class SequenceParallel : public DistributedAttention {
 public:
  SequenceParallel(const Problem& problem, const Plan& plan, Communicator& world)
      : problem_(problem),
        plan_(plan),
        comm_(world.split(0, world.rank())),
        layout_(plan.layout, problem.seq, world.size(), plan.stripe),
        parts_(sequence_parts(problem, plan)),
        rank_(comm_->rank()),
        ranks_(comm_->size()),
        own_tokens_(parts_.counts[static_cast<size_t>(rank_)]) {}

  const Problem& problem() const override { return problem_; }
  const Plan& plan() const override { return plan_; }
  const TokenLayout& layout() const override { return layout_; }

 protected:
  Problem problem_;
  Plan plan_;
  std::unique_ptr<Communicator> comm_;
  TokenLayout layout_;
  SequenceParts parts_;
  int rank_ = 0;
  int ranks_ = 1;
  int64_t own_tokens_ = 0;
};

std::unique_ptr<DistributedAttention> make_attention2d(const Problem& problem, const Plan& plan,
                                                       Communicator& world);
std::unique_ptr<DistributedAttention> make_ring(const Problem& problem, const Plan& plan,
                                                Communicator& world);
std::unique_ptr<DistributedAttention> make_allgather_kv(const Problem& problem, const Plan& plan,
                                                        Communicator& world);
std::unique_ptr<DistributedAttention> make_ulysses(const Problem& problem, const Plan& plan,
                                                   Communicator& world);

}  // namespace a2d::algorithms
