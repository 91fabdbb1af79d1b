// attention2d: errors that every rank raises together.
//
// A distributed job must not hang when one rank finds a problem (a file it cannot read, a shape
// that does not match): collective_check runs a stage on every rank, agrees on whether any rank
// failed, and then every rank throws the same CollectiveError carrying the first failing rank's
// message. Programs return after a CollectiveError; after any other error they abort the job.
#pragma once

#include <functional>

#include "attention2d/comm.hpp"
#include "attention2d/error.hpp"

namespace a2d {

class CollectiveError : public Error {
 public:
  using Error::Error;
};

void collective_check(Communicator& comm, const std::function<void()>& stage);

}  // namespace a2d
