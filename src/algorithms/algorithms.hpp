// Internal: constructors of the distributed algorithms.
#pragma once

#include <memory>

#include "attention2d/attention.hpp"

namespace a2d::algorithms {

std::unique_ptr<DistributedAttention> make_attention2d(const Problem& problem, const Plan& plan,
                                                       Communicator& world);
std::unique_ptr<DistributedAttention> make_ring(const Problem& problem, const Plan& plan,
                                                Communicator& world);
std::unique_ptr<DistributedAttention> make_allgather_kv(const Problem& problem, const Plan& plan,
                                                        Communicator& world);
std::unique_ptr<DistributedAttention> make_ulysses(const Problem& problem, const Plan& plan,
                                                   Communicator& world);

}  // namespace a2d::algorithms
