"""Launches that would otherwise compute alone: a torchrun-style environment (WORLD_SIZE > 1)
without an initialised process group is refused with a message naming both sizes, before any
MPI is initialised; and scripts/launch/launch.py passes torch's env:// variables and a failing rank's
exit code. Runs as one plain process (tests/CMakeLists.txt: python.launch)."""

import os
import subprocess
import sys


HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCH = os.path.join(HERE, "..", "..", "scripts", "launch", "launch.py")
CALL = ("import torch, attention2d\n"
        "q = torch.randn(1, 4, 1, 8)\n"
        "try:\n"
        "    attention2d.attention(q, q, q, layout='contiguous')\n"
        "    print('COMPUTED')\n"
        "except attention2d.Error as e:\n"
        "    print('ERROR', e)\n")


def run(code, **env):
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("OMPI_", "PMI", "PMIX", "RANK", "WORLD_SIZE", "MASTER_"))}
    clean.update(env)
    return subprocess.run([sys.executable, "-c", code], env=clean, capture_output=True,
                          text=True, timeout=120)


def test_world_size_without_process_group_is_refused():
    result = run(CALL, WORLD_SIZE="4", RANK="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="29999")
    assert "ERROR WORLD_SIZE=4" in result.stdout, result.stdout + result.stderr
    assert "init_process_group" in result.stdout
    # MPI was never initialised in the child: mpi4py.MPI not imported there.
    probe = run(CALL + "import sys; print('MPI' if 'mpi4py.MPI' in sys.modules else 'NO MPI')\n",
                WORLD_SIZE="4", RANK="2")
    assert "NO MPI" in probe.stdout, probe.stdout + probe.stderr


def test_one_process_alone_needs_no_launcher():
    result = run(CALL + "import sys; print('MPI' if 'mpi4py.MPI' in sys.modules else 'NO MPI')\n")
    assert "COMPUTED" in result.stdout and "NO MPI" in result.stdout, result.stdout + result.stderr


def test_launcher_sets_env_and_propagates_failures():
    code = ("import os, sys\n"
            "r = int(os.environ['RANK'])\n"
            "assert os.environ['WORLD_SIZE'] == '3' and os.environ['MASTER_ADDR']\n"
            "sys.exit(7 if r == 2 else 0)\n")
    result = subprocess.run([sys.executable, LAUNCH, "--nproc", "3", "--", sys.executable, "-c",
                             code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 7, result.stderr
    hang = ("import os, sys, time\n"
            "sys.exit(5) if os.environ['RANK'] == '0' else time.sleep(600)\n")
    result = subprocess.run([sys.executable, LAUNCH, "--nproc", "2", "--grace", "1", "--",
                             sys.executable, "-c", hang], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 5 and "rank 0 exited with code 5" in result.stderr, result.stderr
