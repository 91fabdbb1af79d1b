"""Engines: one per (channel, problem, plan, caller's layout), kept in a least-recently-used
cache (cache_info(), clear_cache()) and released at exit before MPI is finalised."""

import atexit
import collections

from . import _channel, _core
from ._planning import _InPythonWords, _problem_key

ENGINE_CACHE_SIZE = 8


# Tests only: the backend that CPU torch tensors run on as if they were CUDA tensors ("fenced-cuda":
# memory only the backend may touch, the CUDA kernels' rules; docs/gpu.md, "CUDA tensors from
# PyTorch"). None in use: CPU tensors run on the CPU backend.
_CPU_STAND_IN = None


class _EngineCache:
    """At most ENGINE_CACHE_SIZE engines, least recently used dropped first. Every rank of a
    channel makes the same calls in the same order, so every rank keeps and drops the same
    engines (dropping one is local: its communicators are freed without messages)."""

    def __init__(self):
        self._engines = collections.OrderedDict()
        self.made = 0

    def get(self, key, make):
        engine = self._engines.get(key)
        if engine is not None:
            self._engines.move_to_end(key)
            return engine
        engine = make()
        self.made += 1
        self._engines[key] = engine
        while len(self._engines) > ENGINE_CACHE_SIZE:
            self._engines.popitem(last=False)
        return engine

    def clear(self):
        self._engines.clear()

    def forget_channel(self, chan):
        """Drops the engines made on `chan` (released: its group is gone)."""
        for key in [key for key in self._engines if key[0] == id(chan)]:
            del self._engines[key]

    def __len__(self):
        return len(self._engines)


_engines = _EngineCache()
_channel._on_release.append(_engines.forget_channel)


def cache_info():
    """{"engines": engines kept now, "made": engines made so far, "limit": ENGINE_CACHE_SIZE}."""
    return {"engines": len(_engines), "made": _engines.made, "limit": ENGINE_CACHE_SIZE}


def clear_cache():
    """Drops every cached engine and every channel (the groups' transports, the watchdog): after
    it attention2d holds nothing of any process group. Collective only in that every rank should
    do it together. torch dropping a group (destroy_process_group) releases its channel and
    engines by itself."""
    _engines.clear()
    _channel.release()


def _engine_device(device):
    """(backend, over NCCL) of the engine for tensors on `device` ("cpu" or "cuda:N")."""
    if device == "cpu":
        return (_CPU_STAND_IN or "cpu"), False
    return device, True


def _engine(chan, problem, chosen, shards, device="cpu"):
    """The engine of (problem, plan, the caller's layout `shards`) on the channel, for tensors on
    `device` ("cpu", or "cuda:N": the CUDA backend on that GPU, its messages over NCCL where the
    channel's group is an NCCL group, else staged through host memory): `shards` is ("plan",)
    for shards in the plan's own layout, else (kind, counts)."""
    backend, on_gpu = _engine_device(device)
    nccl = on_gpu and getattr(chan, "nccl", False)
    key = (id(chan), _problem_key(problem), chosen.describe(), chosen.threads, shards, backend,
           nccl)

    def make():
        _channel.start_watchdog_once(chan)
        with _InPythonWords():
            if shards[0] == "plan":
                return _core.Engine(problem, chosen, chan.transport, device=backend, nccl=nccl)
            return _core.Engine(problem, chosen, chan.transport, shards[0], list(shards[1]),
                                device=backend, nccl=nccl, slots=list(chan.slots or []))

    return _engines.get(key, make)


@atexit.register
def _release():
    # Before mpi4py finalises MPI (its own atexit hook ran earlier, so it runs later).
    _engines.clear()
    _channel.release()

