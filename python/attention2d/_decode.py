"""Inference from Python: prefill a prompt into a KV cache distributed over the ranks, then
decode steps of T new tokens (docs/inference.md, attention2d/inference.hpp)."""

import numpy as np

from . import _channel, _core
from ._channel import Error, torch
from ._planning import _InPythonWords, _problem, _resolve_plan
from ._sharding import Layout
from ._tensors import _check_inputs, _describe_dtype, _engine_ready, _is_torch, _view


class Decoder:
    """A distributed KV cache and its decode steps. Collective over group= (a torch.distributed
    ProcessGroup) or comm= (an mpi4py communicator), by default the same ranks as attention():
    every rank builds it with the same arguments and calls prefill() once, then step() with the
    same number of tokens.

        dec = attention2d.Decoder(prompt=n, heads=h, kv_heads=g, head_dim=d)
        out, lse = dec.prefill(q_local, k_local, v_local)    # this rank's prompt tokens:
                                                             # dec.layout.tokens()
        pos = dec.next_positions(t)                          # this rank's of the t new tokens
        out, lse = dec.step(q_new, k_new, v_new)             # [batch, len(pos), heads, d] ...

    The mask is causal (window > 0: q - window < k <= q). Each new token is cached at the rank
    holding the fewest tokens (lowest rank on ties), which passes its Q, K, V and receives its O
    and LSE; a rank that owns none of a step's tokens passes tensors of 0 tokens. Tensors: torch
    (float32, bfloat16, float16) or numpy (float32, float16), on the CPU."""

    def __init__(self, prompt, heads, head_dim, kv_heads=None, batch=1, window=0,
                 softmax_scale=None, dtype="float32", algo="auto", grid=None, comm=None,
                 capacity=0, threads=1, machine=None, calibration=None, sinks=None, softcap=0.0,
                 group=None):
        self.channel = _channel.channel(comm, group, grid)
        grid = _channel.planner_grid(grid)
        error, problem, chosen = "", None, None
        try:
            problem = _problem(prompt, heads, head_dim, kv_heads, batch, True, window,
                               softmax_scale, dtype, None, sinks is not None, softcap)
            chosen = _resolve_plan(problem, self.channel.size, algo, grid, machine,
                                   calibration, threads, order=self.channel.order)
            if int(capacity) < 0:
                error = "capacity must be >= 0 tokens, got %d" % int(capacity)
        except Error as e:
            error = str(e)
        self.channel.raise_collectively(error, phase="Decoder arguments")
        self.problem = problem
        self.plan = chosen
        self.layout = Layout(problem, chosen, self.channel.size, self.channel.rank,
                             slots=self.channel.slots)
        self._sinks = None
        if sinks is not None:
            values = sinks.detach().tolist() if _is_torch(sinks) else np.asarray(sinks).tolist()
            self._sinks = np.ascontiguousarray(values, dtype=np.float32)
        _channel.start_watchdog_once(self.channel)
        with _InPythonWords():
            self._engine = _core.DecoderEngine(problem, chosen, self.channel.transport,
                                               int(capacity))
        self._prefilled = False

    @property
    def sequence(self):
        """Tokens cached over all ranks (prompt and decoded)."""
        return self._engine.sequence

    @property
    def capacity(self):
        """This rank's cache capacity in tokens (it doubles when full)."""
        return self._engine.capacity

    @property
    def reallocations(self):
        return self._engine.reallocations

    def cached_positions(self):
        """The global positions this rank caches, increasing."""
        return np.asarray(self._engine.positions(), dtype=np.int64)

    def next_step(self, tokens):
        """The next step of `tokens` tokens: first_position, owners (per new token), counts
        (per rank) and positions (this rank's); ranks are the caller's (for a grid= DeviceMesh,
        torch's)."""
        step = self._engine.next_step(int(tokens))
        slots = self.channel.slots
        if slots:
            step["owners"] = [slots[e] for e in step["owners"]]
            step["counts"] = self.channel.in_caller_order(step["counts"])
        return step

    def next_positions(self, tokens):
        """The global positions of the next step's tokens this rank owns (its rows of step())."""
        return np.asarray(self.next_step(tokens)["positions"], dtype=np.int64)

    def _check(self, q, k, v, expected, what):
        error = _check_inputs(q, k, v)
        p = self.problem
        if not error:
            b, n, h, d = q.shape
            if (b, h, k.shape[2], d) != (p.batch, p.heads, p.kv_heads, p.head_dim):
                error = ("%s: q must be [%d, tokens, %d, %d] and k, v [%d, tokens, %d, %d], got "
                         "%s and %s" % (what, p.batch, p.heads, p.head_dim, p.batch, p.kv_heads,
                                        p.head_dim, list(q.shape), list(k.shape)))
            elif n != expected:
                error = "%s: this rank owns %d of the tokens, but q holds %d" % (what, expected, n)
            elif _describe_dtype(q).replace("bfloat16", "bf16").replace(
                    "float32", "fp32").replace("float16", "fp16") != p.dtype:
                error = "%s: the decoder is %s, the tensors %s" % (what, p.dtype,
                                                                  _describe_dtype(q))
        self.channel.raise_collectively(error, phase="Decoder arguments")

    def _call(self, run, q, k, v):
        q, k, v = _engine_ready(q), _engine_ready(k), _engine_ready(v)
        if _is_torch(q):
            out = torch.empty(q.shape, dtype=q.dtype)
            lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
        else:
            out = np.empty(q.shape, dtype=q.dtype)
            lse = np.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=np.float32)
        sinks = 0 if self._sinks is None else self._sinks.ctypes.data
        run(_view(q), _view(k), _view(v), _view(out), _view(lse), sinks)
        return out, lse

    def prefill(self, q, k, v):
        """Collective, once: the forward over the prompt (this rank's tokens in layout order,
        self.layout.tokens()); the K and V become the cache. Returns this rank's O and LSE."""
        error = "prefill() runs once per Decoder" if self._prefilled else ""
        self.channel.raise_collectively(error, phase="Decoder arguments")
        self._check(q, k, v, len(self.layout.tokens()), "prefill")
        result = self._call(self._engine.prefill, q, k, v)
        self._prefilled = True
        return result

    def step(self, q, k, v, tokens=None):
        """Collective: one decode step. q, k, v hold this rank's new tokens (next_positions(T)
        of the step's T tokens; T is the sum over the ranks, or `tokens`). Returns their O and
        LSE: attention over the whole cache, causal within the step."""
        error = "" if self._prefilled else "step() needs the cache: call prefill() first"
        mine = int(q.shape[1]) if len(getattr(q, "shape", ())) == 4 else 0
        counts = self.channel.raise_collectively(error, mine, phase="Decoder arguments")
        total = sum(counts) if tokens is None else int(tokens)
        error = "" if total >= 1 else "a decode step appends at least one token, got %d" % total
        totals = self.channel.raise_collectively(error, total, phase="Decoder arguments")
        if len(set(totals)) > 1:
            raise Error("the ranks passed different step sizes; every rank must pass the same "
                        "tokens=: %s by rank" % totals)
        self._check(q, k, v, len(self.next_positions(total)), "step")
        return self._call(lambda *a: self._engine.step(total, *a), q, k, v)
