// Internal: what the watchdog's files share (watchdog.hpp; the link between the ranks' watchdogs is
// watchdog_link.hpp): the engine (engine.cpp), the signal handling (signals.cpp), the link over MPI
// (mpi_link.cpp), the /proc TCP probe (tcp_probe.cpp) and the test-only fault injection
// (faults.cpp).
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "comm/watchdog_link.hpp"
#ifdef A2D_WITH_MPI
#include <mpi.h>
#endif

namespace a2d::watchdog_detail {

// Seconds on the steady clock.
double now();

// Another rank told this one that it is ending the job for a signal it received (MPI link).
extern std::atomic<bool> g_end_announced;

// Ends the job for signal exit code `code` through the active watchdog's link, the others ending
// without a line of their own (Link::abort_job, quiet); returns where no watchdog is running.
void abort_job_for_signal(int code);

// Test-only fault injection (watchdog.hpp: A2D_FAULT_STALL, A2D_FAULT_EXIT) as this rank enters
// `phase`.
void inject_faults(const std::string& phase);

#ifdef A2D_WITH_MPI
// The link over a duplicate of `comm` (MPI_Abort ends the job).
std::unique_ptr<Link> make_mpi_link(MPI_Comm comm);
#endif

}  // namespace a2d::watchdog_detail
