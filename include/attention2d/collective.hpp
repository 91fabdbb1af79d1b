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
  // `text` is the complete report (the failing rank's own what(), which names that rank and the
  // source line); `brief` the same without the source line, naming the rank only when not every
  // rank failed: "rank 2: K has shape ..." or "K has shape ... (on every rank)".
  CollectiveError(std::string text, std::string brief, const char* file, int line)
      : Error(text, file, line), text_(std::move(text)), brief_(std::move(brief)) {}
  const char* what() const noexcept override { return text_.c_str(); }
  const std::string& brief() const { return brief_; }

 private:
  std::string text_;
  std::string brief_;
};

void collective_check(Communicator& comm, const std::function<void()>& stage);

}  // namespace a2d
