// attention2d: the Session, the one way a front end (a2d run and bench, the Python module's
// Engine) builds a distributed run: the world, the backend, the algorithms' communicator, the
// process's watchdog, the attention (with the relayout from the caller's layout) and the ranks'
// agreement, and every conversion of host values to and from the problem's dtype.
//
//   Session s(world, make_backend("cpu"));              // the caller's ranks, a backend
//   s.connect(CommKind::gloo, [&] { return mesh(); });  // optional: the algorithms' own comm
//   s.watch(std::move(watchdog), timeout);              // optional: the process's watchdog
//   auto attention = s.attention(problem, plan, &shards);  // validated and agreed, collectively
//   attention->forward(...);                            // on the caller's shards
//
// Everything collective here is collective over the world: every rank makes the same calls in the
// same order, and a refusal on any rank throws the same CollectiveError on every rank before any
// data moves (collective.hpp).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "attention2d/attention.hpp"
#include "attention2d/backend.hpp"
#include "attention2d/comm.hpp"
#include "attention2d/comm_kind.hpp"
#include "attention2d/inference.hpp"
#include "attention2d/relayout.hpp"

namespace a2d {

class Watchdog;

class Session {
 public:
  // `world`: the caller's ranks (an MPI communicator, a CountingCommunicator around one, a torch
  // process group's communicator), kept by reference: it must outlive the session. `backend`:
  // the device the algorithms compute on, owned.
  Session(Communicator& world, std::unique_ptr<Backend> backend);
  // The same with the world owned (a duplicate of a transport, an NCCL communicator).
  Session(std::unique_ptr<Communicator> world, std::unique_ptr<Backend> backend);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Collective: the algorithms run on the communicator `make` returns (a Gloo mesh, an NCCL
  // communicator over the world's ranks: mpi_comm.hpp's make_communicator) instead of the world;
  // a refusal on any rank throws on every rank. CommKind::mpi without `make`: the world itself.
  void connect(CommKind kind, const std::function<std::unique_ptr<Communicator>()>& make = {});

  // The process's watchdog (one per process), kept for the session's life: `watchdog` as the
  // caller made it (over MPI, which covers the start of a job; may be null). Where the algorithms
  // run on a Gloo mesh (connect) and timeout > 0, a watchdog over the mesh replaces it: a rank
  // whose connection closes is noticed at once. Collective.
  void watch(std::unique_ptr<Watchdog> watchdog, double timeout);

  Communicator& world() { return *world_; }
  // The algorithms' communicator: the world unless connect() gave another.
  Communicator& communicator() { return algorithms_ ? *algorithms_ : *world_; }
  Backend& backend() { return *backend_; }
  CommKind comm_kind() const { return kind_; }

  // Collective: the attention of (problem, plan) over communicator() on this backend, on shards in
  // `shards` (nullptr: the plan's own layout; else every call exchanges the caller's shards to the
  // plan's layout and back: relayout.hpp, stateless). Before any data moves every rank validates
  // the problem, the plan and the backend's support, and the ranks check that they agree on all
  // of them and on `shards` (check_agreement, the library's agreement check for every front end;
  // the Python layer also compares the caller's arguments on every call: docs/architecture.md).
  std::unique_ptr<DistributedAttention> attention(const Problem& problem, const Plan& plan,
                                                  const TokenLayout* shards = nullptr);

  // Collective: a prefill and its decode steps (inference.hpp's make_decoder) over communicator()
  // on this backend, validated and agreed on every rank as attention() is.
  std::unique_ptr<DistributedDecoder> decoder(const Problem& problem, const Plan& plan,
                                              int64_t capacity);

  // The exchange of token rows from layout `from` to layout `to` on this backend (for shards a
  // caller keeps between calls: relayout.hpp, saved); nullptr where no rank's tokens differ.
  std::unique_ptr<LayoutExchange> relayout(const TokenLayout& from, const TokenLayout& to);

 private:
  std::unique_ptr<Communicator> own_world_;
  Communicator* world_;
  std::unique_ptr<Backend> backend_;
  CommKind kind_ = CommKind::mpi;
  std::unique_ptr<Communicator> algorithms_;
  // Last: stopped before the communicators it watches go.
  std::unique_ptr<Watchdog> watchdog_;
};

// Host fp32 values <-> a buffer of `backend` holding `dtype` elements, dense [batch, tokens,
// heads, width]: every conversion between fp32 and a 16-bit dtype is the backend's copy_tokens
// (rounding to nearest even), never the host's. upload_values also rounds `host` in place to what
// the buffer holds (a caller's host copy then equals the shard it computes on).
void upload_values(Backend& backend, std::vector<float>& host, Buffer& to, DType dtype,
                   const TokenBlock& shape);
void download_values(Backend& backend, Buffer& from, DType dtype, const TokenBlock& shape,
                     std::vector<float>& host);

}  // namespace a2d
