// The watchdog's signal handling (watchdog.hpp, Watchdog::stop_on_signals): SIGTERM and SIGINT
// end the whole job once, with one line, whichever ranks received them.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <mutex>
#include <string>
#include <thread>

#include "attention2d/error.hpp"
#include "attention2d/watchdog.hpp"
#include "shared.hpp"

namespace a2d {

namespace watchdog_detail {
namespace {

// What a signal handler passes to the thread that acts on it: async-signal-safe, a write().
struct Received {
  int32_t signal = 0;
  int32_t sender = 0;  // the sending process (0: the kernel, e.g. a terminal's Ctrl-C)
};
int g_signal_pipe[2] = {-1, -1};
pid_t g_signal_owner = 0;  // the process whose thread reads the pipe
// Under srun the parent is slurmstepd, which signals every task of the step at once, for a cause
// nobody else reports (scancel, srun's forwarded Ctrl-C, a time limit), and srun or slurmstepd
// sends SIGKILL milliseconds later (srun_job.c: job_force_termination).
bool g_parent_is_slurmstepd = false;
// A parent that is a shell (ranks started by hand with the env:// variables, or by a script) is no
// launcher: a shell sends SIGTERM or SIGINT only when its user's `kill` tells it to, so its signal
// is the user's to this rank, reported as any other sender's. 0 where the parent is no shell.
pid_t g_shell_parent = 0;
int g_slurm_task = -1;  // SLURM_PROCID: the rank before MPI_Init has set one
// Task 0's lines, written by the handler itself (async-signal-safe: a write of a line made before):
// the thread that reads the pipe may run too late, SIGKILL having come first.
std::string g_slurm_lines[2];  // SIGTERM's, SIGINT's
std::atomic<bool> g_slurm_line_written{false};
std::atomic<void (*)()> g_before_stop{nullptr};  // Watchdog::stop_on_signals's before_stop

void on_signal(int signal, siginfo_t* info, void* /*context*/) {
  // A child forked after the handlers were installed (a data loader's worker) has no reading
  // thread: it ends as it would have without them.
  if (::getpid() != g_signal_owner) {
    ::signal(signal, SIG_DFL);
    ::raise(signal);
    return;
  }
  const int saved = errno;
  if (g_parent_is_slurmstepd && g_slurm_task == 0 && info && info->si_code == SI_USER &&
      info->si_pid == ::getppid() && (signal == SIGTERM || signal == SIGINT) &&
      !g_slurm_line_written.exchange(true)) {
    const std::string& line = g_slurm_lines[signal == SIGTERM ? 0 : 1];
    const ssize_t written = ::write(STDERR_FILENO, line.data(), line.size());
    (void)written;
  }
  Received received;
  received.signal = signal;
  received.sender = info && info->si_code == SI_USER ? static_cast<int32_t>(info->si_pid) : 0;
  const ssize_t written = ::write(g_signal_pipe[1], &received, sizeof received);
  (void)written;
  errno = saved;
}

// Only where the disposition is the default: a signal ignored (a background job's SIGINT) stays
// ignored, and a handler of the program's own (Python's signal.signal) stays in charge.
void install(int signal) {
  struct sigaction current = {};
  if (sigaction(signal, nullptr, &current) != 0 || (current.sa_flags & SA_SIGINFO) ||
      current.sa_handler != SIG_DFL)
    return;
  struct sigaction action = {};
  action.sa_sigaction = on_signal;
  action.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&action.sa_mask);
  sigaction(signal, &action, nullptr);
}

// The name of the parent's program (its comm: the executable's file name, as run), "" if unread.
std::string parent_name() {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/comm", static_cast<int>(::getppid()));
  FILE* file = std::fopen(path, "r");
  if (!file) return "";
  char name[32] = {};
  const bool read = std::fgets(name, sizeof name, file) != nullptr;
  std::fclose(file);
  if (!read) return "";
  std::string result = name;
  if (!result.empty() && result.back() == '\n') result.pop_back();
  return result;
}

bool is_shell(const std::string& name) {
  static const char* const shells[] = {"sh",   "bash", "dash", "zsh", "ksh",  "ksh93",  "mksh",
                                       "fish", "tcsh", "csh",  "ash", "yash", "busybox"};
  return std::any_of(std::begin(shells), std::end(shells),
                     [&](const char* shell) { return name == shell; });
}

const char* signal_name(int signal) {
  return signal == SIGTERM ? "SIGTERM" : signal == SIGINT ? "SIGINT" : "a signal";
}

// Ends the job for the first signal received (Watchdog::stop_on_signals).
[[noreturn]] void act_on_signals() {
  Received received;
  for (;;) {
    const ssize_t got = ::read(g_signal_pipe[0], &received, sizeof received);
    if (got == static_cast<ssize_t>(sizeof received)) break;
  }
  const int code = 128 + received.signal;
  const auto from_launcher = [](const Received& r) {
    return r.sender != 0 && r.sender == ::getppid() && r.sender != g_shell_parent;
  };
  // From slurmstepd: every rank has the signal, and SIGKILL follows within milliseconds (no time
  // for rank 0's note to reach the others, nor for MPI_Abort): each rank ends at once with
  // 128 + signal, and only rank 0 prints the line.
  if (from_launcher(received) && g_parent_is_slurmstepd) {
    if (void (*before_stop)() = g_before_stop.load()) before_stop();
    if (!claim_ending()) wait_for_the_end();  // the watchdog is ending the job already
    const int task = error_rank() >= 0 ? error_rank() : g_slurm_task;
    if (task <= 0 && !g_end_announced.load() && !g_slurm_line_written.exchange(true)) {
      const std::string line = "a2d: rank " + std::to_string(std::max(task, 0)) + " received " +
                               signal_name(received.signal) + "; the job stops\n";
      const ssize_t written = ::write(STDERR_FILENO, line.data(), line.size());
      (void)written;
    }
    std::_Exit(code);
  }
  // A signal to every rank at once (scancel, `pkill`, a terminal's Ctrl-C where the ranks share
  // its process group): rank 0 reports it at once, the others after a wait that grows with their
  // rank (0.25 s + 0.05 s per rank), in which the lower rank's end reaches them (its note over
  // the MPI link, its quiet abort over Gloo, or the launcher's signal): one line, not one per
  // rank. The note needs the watchdog (--timeout > 0, the default).
  const int rank = std::max(error_rank(), 0);
  if (!from_launcher(received) && rank > 0) {
    const double until = now() + 0.25 + 0.05 * std::min(rank, 100);
    for (double left = until - now(); left > 0 && !g_end_announced.load(); left = until - now()) {
      pollfd pipe_end = {g_signal_pipe[0], POLLIN, 0};
      if (::poll(&pipe_end, 1, 10) <= 0) continue;
      Received next;
      if (::read(g_signal_pipe[0], &next, sizeof next) == static_cast<ssize_t>(sizeof next) &&
          from_launcher(next)) {
        received.sender = next.sender;  // quiet, with the exit code of the first signal
        break;
      }
    }
  }
  // The program's last step before the end (outputs being linked into place finished; none
  // starts after this).
  if (void (*before_stop)() = g_before_stop.load()) before_stop();
  if (!claim_ending()) wait_for_the_end();  // the watchdog is ending the job already
  // From the launcher (mpirun, orted, torchrun, slurmstepd; not a shell): it is ending the job,
  // because it was told to or because another rank ended; reporting that is its part, or that
  // rank's.
  if (from_launcher(received) || g_end_announced.load()) std::_Exit(code);
  const std::string line = "a2d: rank " + std::to_string(rank) + " received " +
                           signal_name(received.signal) + "; the job stops\n";
  const ssize_t written = ::write(STDERR_FILENO, line.data(), line.size());
  (void)written;
  abort_job_for_signal(code);
#ifdef A2D_WITH_MPI
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) abort_mpi_job(code);
#endif
  std::_Exit(code);
}

}  // namespace
}  // namespace watchdog_detail

void Watchdog::stop_on_signals(bool interrupt, void (*before_stop)()) {
  if (before_stop) watchdog_detail::g_before_stop.store(before_stop);
  static std::once_flag once;
  std::call_once(once, [] {
    if (::pipe2(watchdog_detail::g_signal_pipe, O_CLOEXEC) != 0) return;
    watchdog_detail::g_signal_owner = ::getpid();
    const std::string parent = watchdog_detail::parent_name();
    watchdog_detail::g_parent_is_slurmstepd = parent == "slurmstepd";
    if (watchdog_detail::is_shell(parent)) watchdog_detail::g_shell_parent = ::getppid();
    if (const char* task = std::getenv("SLURM_PROCID"))
      watchdog_detail::g_slurm_task = std::atoi(task);
    for (const int signal : {SIGTERM, SIGINT}) {
      watchdog_detail::g_slurm_lines[signal == SIGTERM ? 0 : 1] =
          "a2d: rank 0 received " + std::string(watchdog_detail::signal_name(signal)) +
          "; the job stops\n";
    }
    std::thread(watchdog_detail::act_on_signals).detach();
    watchdog_detail::install(SIGTERM);
  });
  if (interrupt && watchdog_detail::g_signal_pipe[1] >= 0) watchdog_detail::install(SIGINT);
}

}  // namespace a2d
