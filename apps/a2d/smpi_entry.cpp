// The SMPI build's a2d is a shared object that smpirun loads (cmake/A2dSmpi.cmake); started as a
// program it had no entry point and crashed (exit 139, also for --help). This gives it one: the
// dynamic loader (.interp below) relocates it and jumps here, before any constructor of the
// program has run, so only system calls and C string functions are used. It says how to run it
// and exits: on stdout and 0 for --help, on stderr and 2 otherwise.
#include <fcntl.h>
#include <unistd.h>

#include <cstring>

extern "C" {

#if defined(__x86_64__)
// Where the dynamic loader is, so that the kernel runs it for this shared object.
extern const char a2d_smpi_interp[] __attribute__((section(".interp"))) =
    "/lib64/ld-linux-x86-64.so.2";
#endif

namespace {

void say(int fd, const char* text) {
  const ssize_t written = write(fd, text, std::strlen(text));
  (void)written;
}

// Whether the command line (/proc/self/cmdline: arguments separated by NULs) holds --help or -h.
bool asks_for_help() {
  static char line[4096];
  const int fd = open("/proc/self/cmdline", O_RDONLY);
  if (fd < 0) return false;
  const ssize_t n = read(fd, line, sizeof line - 1);
  close(fd);
  for (ssize_t at = 0; at < n; at += static_cast<ssize_t>(std::strlen(line + at)) + 1) {
    if (std::strcmp(line + at, "--help") == 0 || std::strcmp(line + at, "-h") == 0) return true;
  }
  return false;
}

}  // namespace

// The entry point (-Wl,-e,a2d_smpi_entry). The stack is aligned as at a program's start, not as
// after a call: realigned.
__attribute__((force_align_arg_pointer, noreturn, used)) void a2d_smpi_entry() {
  const bool help = asks_for_help();
  say(help ? 1 : 2,
      "this is the SMPI build of a2d (a2d sim): a shared object that SimGrid's smpirun loads, "
      "not a program to run by itself. Run it through sim/run.sh (sim/run.sh --platform NAME "
      "-np P -- [a2d sim options]); its options: sim/run.sh -- --help, or a2d sim --help of the "
      "native build (docs/simulation.md)\n");
  _exit(help ? 0 : 2);
}

}  // extern "C"
