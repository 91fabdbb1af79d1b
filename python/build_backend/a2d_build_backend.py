"""attention2d's build backend (pyproject.toml, build-backend): scikit-build-core's, which also says
on the terminal what it is doing while `pip install .` compiles the C++ engine for minutes.

pip runs a build backend with its output captured and shows only a spinner ("Building wheel for
attention2d (pyproject.toml) ... |") until it ends; nothing a backend prints reaches the user
without `pip install -v`, and pip passes no verbosity to it (pypa/pip#6634). So, where pip is this
process's parent, runs without -v or -q, and its own output is this process's controlling
terminal (the one its spinner turns on), build_wheel and build_editable write to that terminal
(/dev/tty) themselves: first what is being built and about how long it takes here, then one line
that follows the build (CMake's and ninja's own "[37/92] Building CXX object ..." lines, read from
the build's output on their way to pip, which still receives every byte). Anywhere else (pip -v,
pip -q, output redirected, no terminal, another front end) nothing changes: the same output goes
to the same place. docs/python.md, "Building and installing"."""

import os
import re
import sys
import textwrap
import threading
import time

from scikit_build_core.build import *  # noqa: F401,F403 (every hook scikit-build-core offers)
from scikit_build_core import build as _scikit_build_core

# Measured (docs/python.md, "Building and installing"): compiling everything `pip install .`
# builds (the engine, _core and _c10d: 112 ninja steps with MPI and Gloo) took 180 CPU-seconds
# (user + system) with GCC 12 at -O3 on the reference machine; ninja runs a step per core.
_CPU_SECONDS = 180.0
# However many cores: the library's slowest object (~5 s), then _core's module.cpp (9 s) and its
# link (9 s, link-time optimised) run one after another.
_LONGEST_CHAIN_SECONDS = 25.0

# CMake's build lines: ninja's "[37/112] Building CXX object ..." and make's "[ 45%] Building ...";
# scikit-build-core's own steps ("*** Configuring CMake...").
_NINJA = re.compile(r"^\[(\d+)/(\d+)\] (.*)$")
_MAKE = re.compile(r"^\[\s*(\d+)%\] (.*)$")
_STEP = re.compile(r"^\*\*\* (.*)$")
_OBJECT = re.compile(r"^Building CXX object .*?\.dir/(.+)\.o$")


def _pip_verbosity(argv):
    """pip's -v (+1 each) and -q (-1 each) from its command line and PIP_VERBOSE / PIP_QUIET."""
    level = 0
    for arg in argv:
        if arg == "--verbose":
            level += 1
        elif arg == "--quiet":
            level -= 1
        elif re.fullmatch(r"-[vq]+", arg):
            level += arg.count("v") - arg.count("q")
    for name, sign in (("PIP_VERBOSE", 1), ("PIP_QUIET", -1)):
        value = os.environ.get(name, "").strip().lower()
        if value in ("true", "yes", "on"):
            level += sign
        elif value.isdigit():
            level += sign * int(value)
    return level


def _is_pip(argv):
    """Whether a command line is pip's (`pip install`, `pip3.11 wheel`, `python -m pip ...`)."""
    names = [os.path.basename(arg) for arg in argv[:3]]
    return (any(re.fullmatch(r"pip[0-9.]*", name) for name in names)
            or any(a == "-m" and b == "pip" for a, b in zip(argv, argv[1:])))


def _terminal():
    """The terminal pip's spinner turns on, open for writing, or None (see the module's text)."""
    parent = os.getppid()
    try:
        with open("/proc/%d/cmdline" % parent, "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        pip_output = os.stat("/proc/%d/fd/1" % parent)
        with open("/proc/self/stat") as f:
            tty_nr = int(f.read().rsplit(")", 1)[1].split()[4])  # the controlling terminal
    except (OSError, ValueError, IndexError):
        return None
    if not _is_pip(argv) or _pip_verbosity(argv) != 0 or tty_nr == 0:
        return None
    major, minor = (tty_nr >> 8) & 0xFFF, (tty_nr & 0xFF) | ((tty_nr >> 12) & 0xFFF00)
    if (os.major(pip_output.st_rdev), os.minor(pip_output.st_rdev)) != (major, minor):
        return None
    try:
        return open("/dev/tty", "w")
    except OSError:
        return None


def _minutes(seconds):
    seconds = int(round(seconds))
    return "%d min %02d s" % divmod(seconds, 60) if seconds >= 60 else "%d s" % seconds


class _Progress:
    """Relays this process's standard output (fd 1, which the build's commands inherit) to where
    it went before, byte for byte, and shows the build's progress on `terminal` as one line that
    it rewrites; pip's spinner turns at its end (two spaces kept free for it)."""

    def __init__(self, terminal):
        self.terminal = terminal
        self.start = time.monotonic()
        self.width = 80
        try:
            self.width = os.get_terminal_size(terminal.fileno()).columns or 80
        except OSError:
            pass

    def show(self, text, end=""):
        line = "  " + text
        if len(line) > self.width - 3:
            line = line[:self.width - 6] + "..."
        try:
            self.terminal.write("\r" + line + "  \x1b[K" + end)
            self.terminal.flush()
        except OSError:  # the terminal went away: the build goes on without it
            pass

    def announce(self, what):
        """What is built and about how long it takes, under pip's "Building wheel ..." line."""
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        cores = max(1, cores or 1)
        busy = ""
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        if load > cores / 2:
            busy = " (they are busy now, load average %.1f: expect longer)" % load
        text = ("attention2d: compiling the C++ engine (%s): about %d CPU-minutes, so about %s "
                "on this machine's %d core%s when idle%s; less where ccache has the objects. pip "
                "shows only a spinner; the line below follows the build, and `pip install -v .` "
                "shows all of it."
                % (what, max(1, round(_CPU_SECONDS / 60)),
                   _minutes(max(_CPU_SECONDS / cores, _LONGEST_CHAIN_SECONDS)), cores,
                   "s" if cores > 1 else "", busy))
        lines = textwrap.wrap(text, max(40, self.width - 4))
        try:
            self.terminal.write("\n" + "".join("  " + line + "\n" for line in lines))
            self.terminal.flush()
        except OSError:
            pass

    def line(self, text):
        elapsed = _minutes(time.monotonic() - self.start)
        for pattern in (_NINJA, _MAKE):
            match = pattern.match(text)
            if match:
                *counts, what = match.groups()
                target = _OBJECT.match(what)
                what = target.group(1) if target else what
                where = "[%s/%s]" % tuple(counts) if len(counts) == 2 else "[%s%%]" % counts[0]
                self.show("%s %s (%s)" % (where, what, elapsed))
                return
        match = _STEP.match(text)
        if match:
            self.show("%s (%s)" % (match.group(1), elapsed))

    def __enter__(self):
        sys.stdout.flush()
        self.saved = os.dup(1)
        read_end, write_end = os.pipe()
        os.dup2(write_end, 1)
        os.close(write_end)
        self.thread = threading.Thread(target=self._relay, args=(read_end,), daemon=True)
        self.thread.start()
        return self

    def _relay(self, read_end):
        pending = b""
        while True:
            try:
                chunk = os.read(read_end, 65536)
            except OSError:
                break
            if not chunk:
                break
            view = memoryview(chunk)
            while view:  # every byte goes on to pip
                try:
                    view = view[os.write(self.saved, view):]
                except OSError:
                    break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            pending = pending[-4096:]  # (a line that long is no step's)
            for text in lines:
                try:
                    self.line(text.decode(errors="replace").rstrip("\r"))
                except Exception:  # noqa: BLE001 (the relay must go on: the build writes into it)
                    pass
        os.close(read_end)

    def __exit__(self, kind, value, traceback):
        sys.stdout.flush()
        os.dup2(self.saved, 1)  # the pipe's last writer closes: the relay reads its end
        self.thread.join(timeout=10)
        if not self.thread.is_alive():  # (else a process left behind holds the pipe: the relay
            os.close(self.saved)        # keeps writing to pip's output through this descriptor)
        elapsed = _minutes(time.monotonic() - self.start)
        if kind is None:
            self.show("attention2d: built in %s" % elapsed)
        else:
            self.show("attention2d: the build failed after %s; pip shows its output" % elapsed,
                      end="\n")
        self.terminal.close()
        return False


def _announced(hook, what):
    def wrapped(*args, **kwargs):
        def say():  # in the build's output too (pip -v, pip's report of a failed build)
            print("attention2d: compiling the C++ engine (%s): about %d CPU-minutes"
                  % (what, max(1, round(_CPU_SECONDS / 60))), flush=True)

        terminal = _terminal()
        if terminal is None:
            say()
            return hook(*args, **kwargs)
        with _Progress(terminal) as progress:
            progress.announce(what)
            say()
            return hook(*args, **kwargs)

    wrapped.__name__ = hook.__name__
    wrapped.__doc__ = hook.__doc__
    return wrapped


_WHAT = "attention2d._core, and attention2d._c10d where torch is installed"
build_wheel = _announced(_scikit_build_core.build_wheel, _WHAT)
build_editable = _announced(_scikit_build_core.build_editable, _WHAT)
