// attention2d: the communicator interface over a caller's own process group (a torch c10d
// ProcessGroup), through a table of plain C operations.
//
// A torch user's job already has a process group whose backend (Gloo on CPUs, NCCL on GPUs)
// moves its tensors. attention2d's Python package carries the engine's messages over that group:
// a small extension module built against the installed torch (python/src/c10d_module.cpp,
// attention2d._c10d) fills an A2dGroupOps table with the group's point-to-point operations and
// collectives, and make_group_communicator() implements the whole Communicator interface over it.
// The table is plain C so that the two modules share no C++ type (the torch extension is built
// with torch's compiler flags and pybind11, the engine's module with the project's): a torch
// release that changes its C++ ABI changes nothing here.
//
//   operations  all_to_all, broadcast, barrier, all_reduce and the all_gather of equal blocks run
//               as the group's own collectives when the communicator spans the whole group;
//               reduce_scatter, uneven all_gathers, send_recv and every operation of a split run
//               as the group's point-to-point sends and receives (Gloo's progress on its own
//               threads, so posted operations overlap computation). Reductions of the direct
//               reduce-scatter run at wait(), over the blocks in rank order: the same bits on
//               every run and every rank.
//   splits      views of the group (no new group, nothing collective in torch): a member list
//               and a tag space of their own. A message's tag is (view id << 16) | tag, tag <
//               0x8000 for send_recv's tags and 0x8000 | n for the view's n-th collective (mod
//               2^15); a view's id is agreed by its members at the split (the largest next free
//               id among them), so no two live views that share a rank share an id until 2^15
//               splits have passed.
//   messages to oneself are copied here (the group has no connection of a rank to itself).
//   errors      an operation the group fails (a peer that exited, the group's timeout) throws
//               a2d::Error with the group's message and this rank's phase.
//
// Host memory only (a device backend's buffers are staged as for MPI); an NCCL group takes the
// same path with its device's memory (the operations wrap the memory as tensors of the group's
// device).
#pragma once

#include <cstdint>
#include <memory>

#include "attention2d/comm.hpp"
#include "attention2d/group_ops.h"

namespace a2d {

// The communicator of the whole group over `ops` (which it owns from here on: ops.release runs
// when this communicator and every split of it are gone). Not collective.
std::unique_ptr<Communicator> make_group_communicator(const A2dGroupOps& ops);

// This process alone (a group of one rank, whose operations never leave the process).
std::unique_ptr<Communicator> make_self_communicator();

}  // namespace a2d
