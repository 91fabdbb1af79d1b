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
  // `text` is the complete report (the failing rank's own what(), which names that rank).
  CollectiveError(std::string text, const char* file, int line)
      : Error(text, file, line), text_(std::move(text)) {}
  const char* what() const noexcept override { return text_.c_str(); }

 private:
  std::string text_;
};

void collective_check(Communicator& comm, const std::function<void()>& stage);

}  // namespace a2d
