// Internal: constructors of the distributed algorithms.
#pragma once

#include <memory>

#include "attention2d/attention.hpp"
#include "attention2d/comm_wrappers.hpp"
#include "attention2d/decomposition.hpp"

namespace a2d::algorithms {

// `comm`, staged through host memory when the backend's buffers are not host-accessible and
// `comm` cannot move them itself (MPI on a GPU's buffers; NCCL moves them).
inline std::unique_ptr<Communicator> staged_if_needed(std::unique_ptr<Communicator> comm,
                                                      Backend& backend) {
  if (!backend.host_accessible() && !comm->moves_backend_buffers())
    comm = make_staged_communicator(std::move(comm), backend);
  return comm;
}

// A private copy of `world` for one algorithm (its messages never mix with the caller's), staged
// where needed.
inline std::unique_ptr<Communicator> private_communicator(Communicator& world, Backend& backend) {
  return staged_if_needed(world.split(0, world.rank()), backend);
}

// What the sequence-parallel algorithms (Ring Attention, all-gather K/V, Ulysses) share: all
// ranks in one group (a private copy of the world, so their messages never mix with the
// caller's) and the shards in the plan's layout.
class SequenceParallel : public DistributedAttention {
 public:
  SequenceParallel(const Problem& problem, const Plan& plan, Communicator& world, Backend& backend)
      : problem_(problem),
        plan_(plan),
        backend_(backend),
        comm_(private_communicator(world, backend)),
        layout_(plan.layout, problem.seq, world.size(), plan.stripe),
        parts_(sequence_parts(problem, plan)),
        rank_(comm_->rank()),
        ranks_(comm_->size()),
        own_tokens_(parts_.counts[static_cast<size_t>(rank_)]),
        wire_(wire_records(problem, problem.kv_heads % ranks_ == 0 ? ranks_ : 0)),
        positions_(upload_indices(backend, parts_.positions)) {}

  const Problem& problem() const override { return problem_; }
  const Plan& plan() const override { return plan_; }
  const TokenLayout& layout() const override { return layout_; }
  Backend& backend() const override { return backend_; }

 protected:
  // The positions of part `part`'s tokens in the backend's copy of parts_.positions.
  Place positions_of(int part) const {
    return Place::in(*positions_, parts_.offsets[static_cast<size_t>(part)] *
                                      static_cast<int64_t>(sizeof(int64_t)));
  }
  Place all_positions() const { return Place::in(*positions_); }

  Problem problem_;
  Plan plan_;
  Backend& backend_;
  std::unique_ptr<Communicator> comm_;
  TokenLayout layout_;
  SequenceParts parts_;
  int rank_ = 0;
  int ranks_ = 1;
  int64_t own_tokens_ = 0;
  WireRecords wire_;
  BufferPtr positions_;  // parts_.positions in the backend's memory
};

// What every algorithm checks of the shards it is given, on its own rank: a buffer of its backend
// in the problem's dtype (make_attention's wrapper has checked the rest on every rank together).
void check_shard_types(const Problem& problem, const Backend& backend, const ForwardShards& s);
void check_shard_types(const Problem& problem, const Backend& backend, const BackwardShards& s);

// `attention` whose forward and backward first run check_shards on every rank of `world`
// together, so that a bad argument on one rank is the same CollectiveError on every rank.
std::unique_ptr<DistributedAttention> with_checked_calls(
    std::unique_ptr<DistributedAttention> attention, Communicator& world);

// make_attention after its collective checks: the plan's algorithm, with sinks where the problem
// has them.
std::unique_ptr<DistributedAttention> make_checked_attention(const Problem& problem,
                                                             const Plan& plan, Communicator& world,
                                                             Backend& backend);

std::unique_ptr<DistributedAttention> make_attention2d(const Problem& problem, const Plan& plan,
                                                       Communicator& world, Backend& backend);
std::unique_ptr<DistributedAttention> make_ring(const Problem& problem, const Plan& plan,
                                                Communicator& world, Backend& backend);
std::unique_ptr<DistributedAttention> make_allgather_kv(const Problem& problem, const Plan& plan,
                                                        Communicator& world, Backend& backend);
std::unique_ptr<DistributedAttention> make_ulysses(const Problem& problem, const Plan& plan,
                                                   Communicator& world, Backend& backend);
std::unique_ptr<DistributedAttention> make_hybrid(const Problem& problem, const Plan& plan,
                                                  Communicator& world, Backend& backend);

// ATTENTION2D (no-overlap or overlapped, per the plan) whose backward can take delta =
// rowsum(dO * O) in place of O: the hybrid computes delta where O is, before its all-to-all, and
// so sends 4 bytes per row instead of O. `world` is the communicator of the grid.
class Attention2DWithDelta : public DistributedAttention {
 public:
  // BackwardShards::out is not read.
  virtual void backward_with_delta(const BackwardShards& shards, const RowTensor& delta) = 0;
};
std::unique_ptr<Attention2DWithDelta> make_attention2d_with_delta(const Problem& problem,
                                                                  const Plan& plan,
                                                                  Communicator& world,
                                                                  Backend& backend);

}  // namespace a2d::algorithms
