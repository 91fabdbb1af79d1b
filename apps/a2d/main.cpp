// a2d: the attention2d command-line program.
#include <malloc.h>

#include <climits>
#include <cstring>
#include <iostream>
#include <new>
#include <optional>
#include <string>

#include "attention2d/collective.hpp"
#include "attention2d/error.hpp"
#include "attention2d/node_layout.hpp"
#include "attention2d/tools/build_info.hpp"
#include "attention2d/version.hpp"
#include "attention2d/watchdog.hpp"
#include "commands.hpp"
#include "sim_options.hpp"

namespace {

struct Subcommand {
  const char* name;
  const char* summary;
  int (*run)(int argc, char** argv, int first);
};

int info(int argc, char** argv, int first) {
  if (argc > first) {
    const bool asked = !std::strcmp(argv[first], "--help");
    (asked ? std::cout : std::cerr)
        << "usage: a2d info\n\nPrints what this build contains (version, MPI, OpenMP, CUDA)\n"
           "and the nodes the launcher's environment gives (Slurm's or Open MPI's variables),\n"
           "which the planner uses where no --machine-file is given.\n";
    return asked ? 0 : 2;
  }
  std::cout << a2d::build_info();
  std::optional<a2d::NodeLayout> layout;
  try {
    layout = a2d::read_node_layout();
  } catch (const a2d::Error& e) {
    std::cerr << "a2d info: the launcher's environment: " << e.message() << "\n";
    return 2;
  }
  if (!layout) {
    std::cout << "nodes: none from a launcher (no Slurm or Open MPI variables): the planner puts "
                 "every rank on one node unless --machine-file says otherwise\n";
    return 0;
  }
  std::cout << "nodes: " << layout->describe();
  if (layout->node_id >= 0) std::cout << "; this task: node " << layout->node_id;
  if (layout->local_id >= 0) std::cout << ", local task " << layout->local_id;
  std::cout << "\n";
  return 0;
}

const Subcommand kSubcommands[] = {
    {"info", "what this build contains: version, MPI library, OpenMP, CUDA devices", info},
    {"kernel", "run, time and check the local attention kernel on generated inputs",
     a2d::commands::kernel},
    {"model", "predicted times, words, messages and memory of every algorithm and grid (--plot)",
     a2d::commands::model},
    {"plan", "the fastest algorithm and grid for a run, by the cost model", a2d::commands::plan},
#ifdef A2D_WITH_MPI_COMMANDS
    {"run", "distributed attention under mpiexec: time, bytes sent, --check, .npy in and out",
     a2d::commands::run},
    {"bench", "every algorithm and grid side by side under mpiexec, with the model's prediction",
     a2d::commands::bench},
    {"decode", "prefill a prompt into a distributed KV cache, then time and --check decode steps",
     a2d::commands::decode},
    {"calibrate", "measure this machine (kernel rate, latency, bandwidth) for the cost model",
     a2d::commands::calibrate},
#endif
#ifdef A2D_WITH_SIM_COMMAND
    {"sim", "plans of the engine on the simulated device inside SimGrid (sim/run.sh)",
     a2d::commands::sim},
#else
    {"sim", "inside SimGrid only: build/smpi/a2d under sim/run.sh (docs/simulation.md)",
     a2d::commands::sim_elsewhere},
#endif
};

void print_help() {
  std::cout << "usage: a2d <subcommand> [options]\n\n"
               "attention2d " A2D_VERSION_STRING
               ": exact distributed self-attention (ATTENTION2D).\n\nsubcommands:\n";
  for (const Subcommand& s : kSubcommands) {
    std::string name = s.name;
    name.resize(12, ' ');
    std::cout << "  " << name << s.summary << "\n";
  }
  std::cout << "\nRun 'a2d <subcommand> --help' for its options; 'a2d --version' for the version.\n"
               "--verbose (with any subcommand): errors with their source line, from every rank.\n";
}

}  // namespace

namespace a2d::commands {
bool g_verbose = false;

#ifndef A2D_WITH_SIM_COMMAND
int sim_elsewhere(int argc, char** argv, int first) {
  const char* where =
      "a2d sim runs inside SimGrid: sim/run.sh starts the SMPI build of a2d\n"
      "(build/smpi/a2d, built beside this one where libsimgrid-dev is installed) on a\n"
      "simulated platform; docs/simulation.md\n";
  for (int i = first; i < argc; ++i) {
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      // The SMPI build's options, printed here: that binary runs only under smpirun, whose
      // SimGrid takes --help for itself (sim/run.sh ... -- --help comes here).
      SimOptions o;
      cli::Options options(kSimUsage, std::string(kSimAbout) +
                                          " This build lists the options only: " + where);
      declare_sim_options(options, o);
      std::cout << options.help();
      return 0;
    }
  }
  std::cerr << where;
  return 2;
}
#endif

std::string phase_now() {
  const std::string phase = Watchdog::current_phase();
  return phase.empty() ? "startup" : phase;
}

const char* error_text(const std::exception& e) {
  if (g_verbose) return e.what();
  if (const auto* collective = dynamic_cast<const CollectiveError*>(&e))
    return collective->brief().c_str();
  if (const auto* error = dynamic_cast<const Error*>(&e)) return error->message().c_str();
  return e.what();
}
}  // namespace a2d::commands

int main(int argc, char** argv) {
  // Keep freed memory in the heap instead of returning it to the system: the algorithms'
  // buffers are then reused from one call to the next, as in a training loop, instead of being
  // mapped, faulted in and zeroed by the kernel on every call (a third of a 1-rank call's
  // time otherwise; docs/benchmarks.md). Peak-memory measurements trim the heap first.
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, INT_MAX);
  // --verbose may stand anywhere; it is taken out before the subcommand parses its options.
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--verbose")) {
      a2d::commands::g_verbose = true;
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  argv[argc] = nullptr;
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    print_help();
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "--version")) {
    std::cout << "attention2d " A2D_VERSION_STRING "\n";
    return 0;
  }
  for (const Subcommand& s : kSubcommands) {
    if (std::strcmp(argv[1], s.name) != 0) continue;
    try {
      return s.run(argc, argv, 2);
    } catch (const a2d::Error& e) {
      std::cerr << "a2d " << s.name << ": " << a2d::commands::error_text(e) << "\n";
      return 2;
    } catch (const std::bad_alloc&) {
      // One line naming the phase (the MPI subcommands' own, run_collectively, names the rank).
      std::cerr << "a2d " << s.name << ": out of memory (std::bad_alloc) in phase "
                << a2d::commands::phase_now() << "\n";
      return 3;
    } catch (const std::exception& e) {
      std::cerr << "a2d " << s.name << ": unexpected error: " << e.what() << "\n";
      return 3;
    }
  }
  std::cerr << "a2d: unknown subcommand '" << argv[1] << "'; run 'a2d --help' for the list\n";
  return 2;
}
