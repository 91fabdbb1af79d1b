"""A training loop in which rank 1 misbehaves at step 1, run by tests/python/watchdog_torch.sh
under scripts/launch/launch.py (torch.distributed's env:// variables, gloo):

  skip    rank 1 skips that step's backward and goes on to the next forward
  raise   rank 1's step raises; it reports the error and waits in a cleanup barrier (a common
          pattern: dist.barrier() in a finally), outside attention2d, while the others wait in
          the backward (the watchdog's idle limit is 2 x TIMEOUT here; by default it is the
          process group's own timeout)
  exit    rank 1 leaves the loop and ends its process normally (exit code 0: a data loader that
          ran out early), so the launcher does not stop the others
  freeze  rank 1 stops itself (SIGSTOP) before its backward: alive to the operating system, but
          answering nobody
  slow    rank 1 spends 2.5 x TIMEOUT outside attention2d before its backward (a checkpoint
          save), while the others already wait in the backward: a healthy job, which must finish

    misbehave.py MODE TIMEOUT

The watchdog (on by default; TIMEOUT seconds here) must end the job (exit 124) with a message
naming the phase the waiting ranks are in now, or the rank that is gone; in mode slow the job
must finish (exit 0)."""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import attention2d

mode, timeout = sys.argv[1], float(sys.argv[2])
dist.init_process_group("gloo")
# raise: rank 1 waits outside forever; the idle limit (by default the process group's own
# timeout, 30 minutes) is shortened to 2 x TIMEOUT to end it in the test's time.
attention2d.watchdog(timeout, idle_timeout=2 * timeout if mode == "raise" else None)
rank = dist.get_rank()
torch.manual_seed(rank)
q = torch.randn(1, 24, 2, 8, requires_grad=True)
try:
    for step in range(4):
        out = attention2d.attention(q, q, q, causal=True, layout="contiguous")
        if rank == 1 and step == 1:
            # The moment the watchdog's clock starts for the test (startup under load excluded).
            print("misbehave.py: rank 1 misbehaves at %.3f" % time.time(), flush=True)
            if mode == "skip":
                continue
            if mode == "raise":
                raise RuntimeError("rank 1 fails in its step")
            if mode == "exit":
                sys.exit(0)
            if mode == "freeze":
                os.kill(os.getpid(), signal.SIGSTOP)
            if mode == "slow":
                time.sleep(2.5 * timeout)
        out.sum().backward()
finally:
    if mode == "raise" and rank == 1:
        print("misbehave.py: rank 1 raised; waiting in a cleanup barrier", flush=True)
        dist.barrier()
# One write() per line: the ranks share the launcher's pipe, and print() may write its text and
# its newline apart (two ranks' lines then run together: "rank 2 finishedmisbehave.py: ...").
if mode == "slow":
    os.write(1, b"misbehave.py: rank %d finished\n" % rank)
    sys.exit(0)
os.write(1, b"misbehave.py: rank %d finished (the watchdog should have ended the job)\n" % rank)
time.sleep(600)
