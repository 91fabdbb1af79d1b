#!/usr/bin/env python3
"""Starts P processes the way torchrun does, with torch.distributed's env:// variables (RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), for machines whose torchrun
does not start (Debian's torch 1.13: "AttributeError: 'NoneType' object has no attribute 'get'").

    scripts/launch/launch.py --nproc 4 [--timeout SECONDS] [--grace SECONDS] -- python3 train.py ...

As torchrun: when a process fails (non-zero exit or a signal) the others are stopped (SIGTERM,
then SIGKILL after --grace seconds) and the launcher exits with the first failure's code (128 +
signal for a signal); SIGINT / SIGTERM to the launcher go to every process, it prints one line naming the
signal and exits with 128 + that signal. --timeout bounds the
whole job (exit 124). Output is the processes' own, not prefixed."""

import argparse
import os
import signal
import socket
import subprocess
import sys
import time


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", "--nproc-per-node", "--nproc_per_node", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=0, help="seconds for the whole job")
    parser.add_argument("--grace", type=float, default=5.0,
                        help="seconds between SIGTERM and SIGKILL when stopping the others")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or args.nproc < 1:
        parser.error("give --nproc N >= 1 and a command after --")
    port = free_port()
    processes = []
    for rank in range(args.nproc):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank),
                   WORLD_SIZE=str(args.nproc), LOCAL_WORLD_SIZE=str(args.nproc),
                   GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        processes.append(subprocess.Popen(command, env=env, start_new_session=True))

    def stop_all(sig):
        for p in processes:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass

    received = []

    def on_signal(number, _frame):
        # One line naming it; the processes, signalled by their launcher, end quietly.
        if not received:
            print("launch.py: received %s; the job stops" % signal.Signals(number).name,
                  file=sys.stderr, flush=True)
        received.append(number)
        stop_all(number)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)

    start = time.monotonic()
    failure = None  # (rank, exit code)
    stopping_since = None
    while True:
        codes = [p.poll() for p in processes]
        # Once a signal was received, processes ending are its doing: the exit code is its own.
        if failure is None and not received:
            for rank, code in enumerate(codes):
                if code not in (None, 0):
                    failure = (rank, 128 - code if code < 0 else code)
                    break
        if all(code is not None for code in codes):
            break
        now = time.monotonic()
        if stopping_since is None and (failure is not None or received or (
                args.timeout and now - start > args.timeout)):
            if failure is None and not received:
                print("launch.py: the job ran past --timeout %.0f s; stopping it" % args.timeout,
                      file=sys.stderr, flush=True)
                failure = (-1, 124)
            elif failure is not None and not received:
                print("launch.py: rank %d exited with code %d; stopping the others"
                      % failure, file=sys.stderr, flush=True)
            stop_all(signal.SIGTERM)
            stopping_since = now
        if stopping_since is not None and now - stopping_since > args.grace:
            stop_all(signal.SIGKILL)
        time.sleep(0.05)
    if received and failure is None:
        sys.exit(128 + received[0])
    sys.exit(failure[1] if failure is not None else 0)


if __name__ == "__main__":
    main()
