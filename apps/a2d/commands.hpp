// The a2d subcommands. Each takes the whole argv and the index of its first option, and returns
// the process exit code: 0 success, 1 a check failed, 2 bad usage (a2d::Error).
#pragma once

#include <exception>
#include <string>

namespace a2d::commands {

// --verbose (anywhere on the command line): errors name their source file and line, and every
// rank of a job prints its own. Without it an error that holds on every rank is printed once,
// by rank 0, with no source location.
extern bool g_verbose;

// How an error is printed: its message, or with --verbose what() (rank and source line).
const char* error_text(const std::exception& e);
// The phase this process is in (Watchdog::current_phase; "startup" before the first), for the line
// a std::bad_alloc ends a run with.
std::string phase_now();

int kernel(int argc, char** argv, int first);
int run(int argc, char** argv, int first);        // needs MPI
int calibrate(int argc, char** argv, int first);  // needs MPI
int bench(int argc, char** argv, int first);      // needs MPI
int model(int argc, char** argv, int first);
int plan(int argc, char** argv, int first);
int decode(int argc, char** argv, int first);  // needs MPI
int sim(int argc, char** argv, int first);     // the SMPI build only (sim_command.cpp)
// a2d sim in every other build: says where it runs.
int sim_elsewhere(int argc, char** argv, int first);
// a2d decode's body; bench = true for a2d bench --decode (needs MPI).
int decode_main(int argc, char** argv, int first, bool bench);
// a2d model --decode: the decode step's prediction (docs/inference.md).
int model_decode(int argc, char** argv, int first);
// Whether argv[first..argc) holds `flag`.
bool has_flag(int argc, char** argv, int first, const char* flag);

}  // namespace a2d::commands
