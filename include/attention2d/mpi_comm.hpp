// attention2d: the MPI implementation of the communicator interface.
#pragma once

#include <mpi.h>

#include <chrono>
#include <memory>

#include "attention2d/comm.hpp"

namespace a2d {

// Wraps a duplicate of `comm` (the library's messages never match the caller's). MPI errors are
// returned, not fatal, and become a2d::Error with MPI's message.
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm);

// Initialises MPI unless it already is (thread level MULTIPLE, which the watchdog's helper thread
// needs), and finalises it on destruction if it initialised it. Sets the rank that a2d::Error
// reports.
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  bool owns_ = false;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace a2d

namespace a2d {
// A barrier on `comm` that waits without spinning: ranks that arrive early sleep `poll` between
// polls, leaving the cores to a rank that is still computing (ranks may outnumber cores). Each
// wake-up preempts the computing rank on that core: wait long with a long poll.
void sleeping_barrier(MPI_Comm comm,
                      std::chrono::microseconds poll = std::chrono::microseconds(500));
}  // namespace a2d
