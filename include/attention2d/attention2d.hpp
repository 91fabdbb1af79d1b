// attention2d: the installed library's public surface in one header. A program that uses the
// library includes this (tests/package/consumer does); the headers under attention2d/tools/ are
// the repository's programs' (not installed).
//
//   problem and plan      attention.hpp (Problem, Plan, make_attention), decomposition.hpp
//   ranks and tokens      grid.hpp, layout.hpp, relayout.hpp
//   data and devices      dtype.hpp, backend.hpp (make_backend), kernel.hpp, reference.hpp
//   moving data           comm.hpp, mpi_comm.hpp (with MPI), gloo_comm.hpp, collective.hpp,
//                         watchdog.hpp
//   inference             inference.hpp
//   costs and planning    cost_model.hpp, model.hpp, planner.hpp (choose_plan),
//                         memory_check.hpp (refusing a run its hosts cannot hold)
//   errors, version       error.hpp, version.hpp
#pragma once

#include "attention2d/attention.hpp"
#include "attention2d/backend.hpp"
#include "attention2d/collective.hpp"
#include "attention2d/comm.hpp"
#include "attention2d/cost_model.hpp"
#include "attention2d/decomposition.hpp"
#include "attention2d/dtype.hpp"
#include "attention2d/error.hpp"
#include "attention2d/gloo_comm.hpp"
#include "attention2d/grid.hpp"
#include "attention2d/inference.hpp"
#include "attention2d/kernel.hpp"
#include "attention2d/layout.hpp"
#include "attention2d/memory_check.hpp"
#include "attention2d/model.hpp"
#ifdef A2D_WITH_MPI
#include "attention2d/mpi_comm.hpp"
#endif
#include "attention2d/planner.hpp"
#include "attention2d/reference.hpp"
#include "attention2d/relayout.hpp"
#include "attention2d/session.hpp"
#include "attention2d/version.hpp"
#include "attention2d/watchdog.hpp"
