// attention2d: the installed library's public surface in one header. A program that uses the
// library includes this (tests/package/consumer does); the headers under attention2d/tools/ are
// the repository's programs' (not installed).
//
// In the layer order of tests/layers/check_layers.py:
//   values                problem.hpp (Problem, shapes), mask.hpp, dtype.hpp, plan.hpp (Plan,
//                         Algorithm), grid_shape.hpp, layout.hpp, exchange_maps.hpp, traffic.hpp
//   kernel views          kernel.hpp (the local kernels' views and arguments), reference.hpp
//   data and devices      buffer.hpp, backend.hpp (make_backend)
//   moving data           comm.hpp, comm_wrappers.hpp (counting, staged), comm_kind.hpp,
//                         mpi_comm.hpp (with MPI), gloo_comm.hpp, grid.hpp, collective.hpp,
//                         watchdog.hpp
//   distributed attention attention.hpp (make_attention), relayout.hpp, decomposition.hpp
//   costs and planning    cost_model.hpp, model.hpp, planner.hpp (choose_plan),
//                         memory_check.hpp (refusing a run its hosts cannot hold)
//   inference             inference.hpp
//   sessions              session.hpp (what a front end assembles: world, backend, communicator,
//                         watchdog, relayout, agreement), shard_attention.hpp (the C++ door:
//                         host arrays with their shapes)
//   errors, version       error.hpp, version.hpp
//   measuring             timing.hpp (clock, summaries), peak.hpp (the machine's FMA peak)
#pragma once

#include "attention2d/attention.hpp"
#include "attention2d/backend.hpp"
#include "attention2d/buffer.hpp"
#include "attention2d/collective.hpp"
#include "attention2d/comm.hpp"
#include "attention2d/comm_kind.hpp"
#include "attention2d/comm_wrappers.hpp"
#include "attention2d/cost_model.hpp"
#include "attention2d/decomposition.hpp"
#include "attention2d/dtype.hpp"
#include "attention2d/error.hpp"
#include "attention2d/exchange_maps.hpp"
#include "attention2d/gloo_comm.hpp"
#include "attention2d/grid.hpp"
#include "attention2d/grid_shape.hpp"
#include "attention2d/inference.hpp"
#include "attention2d/kernel.hpp"
#include "attention2d/layout.hpp"
#include "attention2d/memory_check.hpp"
#include "attention2d/model.hpp"
#ifdef A2D_WITH_MPI
#include "attention2d/mpi_comm.hpp"
#endif
#include "attention2d/peak.hpp"
#include "attention2d/plan.hpp"
#include "attention2d/planner.hpp"
#include "attention2d/problem.hpp"
#include "attention2d/reference.hpp"
#include "attention2d/relayout.hpp"
#include "attention2d/session.hpp"
#include "attention2d/shard_attention.hpp"
#include "attention2d/timing.hpp"
#include "attention2d/traffic.hpp"
#include "attention2d/version.hpp"
#include "attention2d/watchdog.hpp"
