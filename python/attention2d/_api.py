"""The pure-Python layer over attention2d._core: argument checks (collective, before any data
moves), plan and engine caching, the torch autograd function, sharding helpers."""

import atexit

import numpy as np

from . import _core
from ._core import Error

try:  # torch is optional: numpy arrays work without it
    import torch
except ImportError:  # pragma: no cover - Debian's python3-torch is installed by scripts/setup.sh
    torch = None

_ATTENTION2D_ALGOS = ("attention2d", "attention2d-overlap")

# ---------------------------------------------------------------------------------------------
# Communicators and collective errors


def _comm(comm):
    if comm is None:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    return comm


def _raise_collectively(comm, local_error, extra=None):
    """Every rank passes its own error text ("" if none); all raise the same Error if any rank
    has one. One all-gather of (error, extra); returns the gathered extras when nobody failed."""
    gathered = comm.allgather((local_error, extra))
    failed = [rank for rank, (error, _) in enumerate(gathered) if error]
    if failed:
        first = failed[0]
        message = gathered[first][0]
        if len(failed) == len(gathered) and len(gathered) > 1:
            message += " (on every rank)"
        else:
            if len(gathered) > 1:
                message = "rank %d: %s" % (first, message)
            if len(failed) > 1:
                message += " (and %d more ranks failed)" % (len(failed) - 1)
        raise Error(message)
    return [value for _, value in gathered]


# ---------------------------------------------------------------------------------------------
# Problems and plans


def _algo_name(algo):
    return "auto" if algo in (None, "auto") else str(algo).replace("_", "-")


def _grid_text(grid):
    if grid is None:
        return ""
    if isinstance(grid, str):
        return grid
    rows, cols = grid
    return "%dx%d" % (int(rows), int(cols))


def _dtype_name(dtype):
    """fp32 / bf16 / fp16 from a numpy or torch dtype or a name."""
    names = {
        "float32": "fp32", "fp32": "fp32", "float": "fp32",
        "bfloat16": "bf16", "bf16": "bf16",
        "float16": "fp16", "fp16": "fp16", "half": "fp16",
    }
    text = str(dtype).replace("torch.", "")
    if text not in names:
        raise Error("unsupported dtype %s: use float32, bfloat16 or float16" % text)
    return names[text]


def _document_lengths(cu_seqlens):
    """Document lengths from flash-attn's cu_seqlens [0, l0, l0 + l1, ..., seq] (None: one
    document)."""
    if cu_seqlens is None:
        return []
    bounds = [int(x) for x in (cu_seqlens.tolist() if hasattr(cu_seqlens, "tolist")
                               else cu_seqlens)]
    if len(bounds) < 2 or bounds[0] != 0:
        raise Error("cu_seqlens must start at 0 and end at the sequence length, got %s"
                    % bounds[:8])
    return [b - a for a, b in zip(bounds[:-1], bounds[1:])]


def _problem(seq, heads, head_dim, kv_heads=None, batch=1, causal=False, window=0,
             softmax_scale=None, dtype="float32", cu_seqlens=None, sinks=False, softcap=0.0):
    p = _core.Problem()
    p.batch = int(batch)
    p.heads = int(heads)
    p.kv_heads = int(heads if kv_heads is None else kv_heads)
    p.seq = int(seq)
    p.head_dim = int(head_dim)
    p.causal = bool(causal)
    p.window = int(window or 0)
    p.scale = 0.0 if softmax_scale is None else float(softmax_scale)
    p.dtype = _dtype_name(dtype)
    p.documents = _document_lengths(cu_seqlens)
    p.sinks = bool(sinks)
    p.softcap = float(softcap or 0.0)
    p.validate()
    return p


def _resolve_plan(problem, ranks, algo="auto", grid=None, machine=None, calibration=None,
                  threads=1, machine_file=None, heads_parallel=None):
    """The plan of a2d run's --algo/--grid/--heads-parallel: the cost model's fastest where not
    pinned down."""
    algo = _algo_name(algo)
    grid = _grid_text(grid)
    hybrid = algo == "hybrid"
    if heads_parallel is not None and not hybrid:
        raise Error("heads_parallel applies to algo='hybrid' only")
    u = int(heads_parallel or 0)
    if grid and hybrid:
        # The grid of each heads group: U x R x C must make the ranks (check_plan says so).
        rows, cols = (int(x) for x in grid.split("x"))
        if u == 0:
            if ranks % (rows * cols):
                raise Error("hybrid: the grid %s does not divide the %d ranks" % (grid, ranks))
            u = ranks // (rows * cols)
    elif grid:
        _core.check_grid(grid, ranks)
    grid_matters = algo == "auto" or algo in _ATTENTION2D_ALGOS or hybrid
    if algo == "auto" or (not grid and grid_matters):
        chosen, _, _ = _core.choose_plan(
            problem, ranks, ranks, machine or "",
            calibration or _core.default_calibration_file(), machine_file or "",
            "" if algo == "auto" else algo, grid if grid_matters else "", u)
    else:
        chosen = _core.default_plan(algo, problem, ranks)
        if grid:
            chosen.grid = tuple(int(x) for x in grid.split("x"))
        if hybrid:
            chosen.heads_parallel = u
    chosen.threads = int(threads)
    _core.check_plan(chosen, problem, ranks)
    return chosen


def plan(seq, heads, head_dim, kv_heads=None, batch=1, causal=False, window=0,
         softmax_scale=None, dtype="float32", algo="auto", grid=None, ranks=None, comm=None,
         machine=None, calibration=None, cu_seqlens=None, sinks=False, softcap=0.0,
         heads_parallel=None):
    """The plan attention() uses for this problem on `ranks` ranks (default: the communicator's
    size): an attention2d._core.Plan with .algorithm, .grid (R, C), .heads_parallel, .layout,
    .describe()."""
    if ranks is None:
        ranks = _comm(comm).Get_size()
    problem = _problem(seq, heads, head_dim, kv_heads, batch, causal, window, softmax_scale, dtype,
                       cu_seqlens, sinks is not False and sinks is not None, softcap)
    return _resolve_plan(problem, int(ranks), algo, grid, machine, calibration,
                         heads_parallel=heads_parallel)


def model(seq, heads, head_dim, kv_heads=None, batch=1, causal=False, window=0,
          softmax_scale=None, dtype="bfloat16", ranks=None, comm=None, ranks_per_node=None,
          machine=None, calibration=None, cu_seqlens=None, softcap=0.0, machine_file=None):
    """The cost model's predictions for every plan that can run the problem, fastest first: a
    list of dicts (algorithm, grid, layout, forward_s, backward_s, words_forward, ...), as
    `a2d model` prints them. machine: a preset (a100-hdr, h100-ndr), "local" (the calibration
    file), or None (local if calibrated, else a placeholder); machine_file: a machine description
    file (a2d's --machine-file, docs/cost-model.md), which then decides."""
    if ranks is None:
        ranks = _comm(comm).Get_size()
    ranks = int(ranks)
    problem = _problem(seq, heads, head_dim, kv_heads, batch, causal, window, softmax_scale, dtype,
                       cu_seqlens, False, softcap)
    ranked, _, machine_text = _core.search_plans(
        problem, ranks, int(ranks_per_node or ranks), machine or "",
        calibration or _core.default_calibration_file(), machine_file or "")
    rows = []
    for chosen, prediction in ranked:
        row = {"algorithm": chosen.algorithm, "grid": chosen.grid,
               "heads_parallel": chosen.heads_parallel, "layout": chosen.layout,
               "plan": chosen.describe(), "machine": machine_text}
        row.update(prediction)
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# Layouts and shards


class Layout:
    """Which global tokens each rank's shards hold (in shard order), for one problem and plan."""

    def __init__(self, problem, chosen, ranks, rank):
        self.problem = problem
        self.plan = chosen
        self.ranks = ranks
        self.rank = rank
        self._tokens = [np.asarray(t, dtype=np.int64)
                        for t in _core.layout_tokens(problem, chosen, ranks)]

    @property
    def seq(self):
        return self.problem.seq

    def tokens(self, rank=None):
        """Global indices of the tokens `rank` (default: this rank) holds, increasing."""
        return self._tokens[self.rank if rank is None else rank]

    def counts(self):
        return [len(t) for t in self._tokens]

    def __repr__(self):
        return "Layout(%s on %d ranks, %s)" % (self.problem.describe(), self.ranks,
                                               self.plan.describe())


def layout(seq, heads=1, head_dim=1, kv_heads=None, batch=1, causal=False, window=0,
           softmax_scale=None, dtype="float32", algo="auto", grid=None, comm=None, plan=None,
           machine=None, calibration=None, cu_seqlens=None, sinks=False, softcap=0.0,
           heads_parallel=None):
    """The layout attention() uses for these arguments (pass the result to attention(layout=)
    to pin its plan): heads, head_dim and dtype matter only when the planner chooses."""
    comm = _comm(comm)
    problem = _problem(seq, heads, head_dim, kv_heads, batch, causal, window, softmax_scale, dtype,
                       cu_seqlens, sinks is not False and sinks is not None, softcap)
    chosen = plan if plan is not None else _resolve_plan(
        problem, comm.Get_size(), algo, grid, machine, calibration, heads_parallel=heads_parallel)
    return Layout(problem, chosen, comm.Get_size(), comm.Get_rank())


def shard(x, layout, dim=1):
    """This rank's shard of the full tensor x (torch or numpy; tokens along `dim`)."""
    index = layout.tokens()
    if x.shape[dim] != layout.seq:
        raise Error("shard: x has %d tokens along dim %d but the layout has %d"
                    % (x.shape[dim], dim, layout.seq))
    if torch is not None and isinstance(x, torch.Tensor):
        return x.index_select(dim, torch.from_numpy(index)).contiguous()
    return np.ascontiguousarray(np.take(x, index, axis=dim))


def unshard(x_local, layout, dim=1, comm=None):
    """Collective: the full tensor from every rank's shard (on every rank)."""
    comm = _comm(comm)
    is_torch = torch is not None and isinstance(x_local, torch.Tensor)
    if is_torch:
        local = x_local.detach()
        dtype = local.dtype
        if dtype == torch.bfloat16:  # numpy has no bf16: move the bits
            local = local.view(torch.int16)
        local = local.cpu().numpy()
    else:
        local = np.asarray(x_local)
    error = ""
    if local.shape[dim] != len(layout.tokens()):
        error = "unshard: this rank's tensor has %d tokens along dim %d, the layout gives it %d" % (
            local.shape[dim], dim, len(layout.tokens()))
    parts = _raise_collectively(comm, error, local)
    shape = list(local.shape)
    shape[dim] = layout.seq
    full = np.empty(shape, dtype=local.dtype)
    for rank, part in enumerate(parts):
        index = [slice(None)] * len(shape)
        index[dim] = layout.tokens(rank)
        full[tuple(index)] = part
    if is_torch:
        result = torch.from_numpy(full)
        return result.view(torch.bfloat16) if dtype == torch.bfloat16 else result
    return full


# ---------------------------------------------------------------------------------------------
# Tensors crossing into the engine


def _is_torch(x):
    return torch is not None and isinstance(x, torch.Tensor)


def _describe_dtype(x):
    return str(x.dtype).replace("torch.", "")


def _engine_ready(x):
    """x itself where the engine can read it in place (the last dimension dense, strides >= 0),
    else a contiguous copy."""
    if _is_torch(x):
        if (x.dim() >= 1 and (x.stride(-1) == 1 or x.shape[-1] <= 1)
                and all(s >= 0 for s in x.stride())):
            return x
        return x.contiguous()
    x = np.asarray(x)
    item = x.itemsize
    if (x.ndim >= 1 and (x.strides[-1] == item or x.shape[-1] <= 1)
            and all(s >= 0 and s % item == 0 for s in x.strides)):
        return x
    return np.ascontiguousarray(x)


def _view(x):
    """(address, dtype, shape, strides in elements) of a tensor the engine reads or writes."""
    if _is_torch(x):
        return (x.data_ptr(), _dtype_name(x.dtype), list(x.shape), list(x.stride()))
    return (x.ctypes.data, _dtype_name(x.dtype), list(x.shape),
            [s // x.itemsize for s in x.strides])


_TORCH_DTYPES = ("float32", "bfloat16", "float16")
_NUMPY_DTYPES = ("float32", "float16")  # numpy has no bfloat16


def _check_inputs(q, k, v):
    """This rank's problem with its inputs, as an error text ("" if they are fine)."""
    tensors = (("q", q), ("k", k), ("v", v))
    kinds = {_is_torch(x) for _, x in tensors}
    if len(kinds) != 1:
        return "q, k and v must all be torch tensors or all numpy arrays"
    for name, x in tensors:
        if _is_torch(x):
            if x.device.type != "cpu":
                return ("%s is on device %s: the Python package runs on CPU tensors; the C++ "
                        "CUDA backend (--device cuda) is not wired to it yet" % (name, x.device))
            allowed = _TORCH_DTYPES
        else:
            if not isinstance(x, np.ndarray):
                return "%s must be a torch tensor or a numpy array, got %s" % (name, type(x))
            allowed = _NUMPY_DTYPES
        if _describe_dtype(x) not in allowed:
            return "%s has dtype %s; supported: %s" % (name, _describe_dtype(x), ", ".join(allowed))
        if len(x.shape) != 4:
            return ("%s must have 4 dimensions [batch, local tokens, heads, head_dim], got shape %s"
                    % (name, list(x.shape)))
    if not (_describe_dtype(q) == _describe_dtype(k) == _describe_dtype(v)):
        return "q, k and v must have one dtype, got %s, %s and %s" % (
            _describe_dtype(q), _describe_dtype(k), _describe_dtype(v))
    b, n, h, d = q.shape
    if tuple(k.shape) != tuple(v.shape):
        return "k and v must have the same shape, got %s and %s" % (list(k.shape), list(v.shape))
    if k.shape[0] != b or k.shape[1] != n or k.shape[3] != d:
        return ("k and v must be [batch, local tokens, kv_heads, head_dim] with q's batch (%d), "
                "local tokens (%d) and head_dim (%d); got %s" % (b, n, d, list(k.shape)))
    hk = k.shape[2]
    if hk < 1 or h % hk:
        return "q's heads (%d) must be a multiple of k's and v's heads (%d)" % (h, hk)
    return ""


# ---------------------------------------------------------------------------------------------
# Engines: one per (problem, plan, communicator), reused across calls

_engines = {}


def _engine(problem, chosen, comm):
    key = (problem.describe(), chosen.describe(), chosen.threads, comm.py2f())
    engine = _engines.get(key)
    if engine is None:
        engine = _core.Engine(problem, chosen, comm)
        _engines[key] = engine
    return engine


@atexit.register
def _release():
    # Before mpi4py finalises MPI (its own atexit hook ran earlier, so it runs later).
    _engines.clear()
    _core.stop_watchdog()


def watchdog(timeout, comm=None):
    """Collective: abort the whole job (exit code 124, naming the phase and the ranks behind)
    when no rank has made progress for `timeout` seconds; 0 turns it off."""
    comm = _comm(comm)
    _core.stop_watchdog()
    if timeout and timeout > 0:
        _core.start_watchdog(comm, float(timeout))


if torch is not None:

    class _AttentionFunction(torch.autograd.Function):
        """The engine's forward and backward; saves only this rank's shards and LSE."""

        @staticmethod
        def forward(ctx, q, k, v, sinks, engine):
            q, k, v = _engine_ready(q), _engine_ready(k), _engine_ready(v)
            out = torch.empty(q.shape, dtype=q.dtype)
            lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
            sink_values = None
            if sinks is not None:
                sink_values = sinks.detach().to(torch.float32).contiguous()
            engine.forward(_view(q), _view(k), _view(v), _view(out), _view(lse),
                           0 if sink_values is None else sink_values.data_ptr())
            ctx.engine = engine
            ctx.has_sinks = sinks is not None
            ctx.save_for_backward(q, k, v, out, lse,
                                  sink_values if sink_values is not None else torch.empty(0))
            ctx.mark_non_differentiable(lse)
            return out, lse

        @staticmethod
        def backward(ctx, d_out, _d_lse):
            q, k, v, out, lse, sink_values = ctx.saved_tensors
            d_out = _engine_ready(d_out.to(q.dtype))
            dq = torch.empty(q.shape, dtype=q.dtype)
            dk = torch.empty(k.shape, dtype=k.dtype)
            dv = torch.empty(v.shape, dtype=v.dtype)
            dsink = torch.zeros(sink_values.shape, dtype=torch.float32)
            ctx.engine.backward(_view(q), _view(k), _view(v), _view(out), _view(d_out),
                                _view(lse), _view(dq), _view(dk), _view(dv),
                                sink_values.data_ptr() if ctx.has_sinks else 0,
                                dsink.data_ptr() if ctx.has_sinks else 0)
            # The engine gives every rank the sum over all ranks' rows. The sinks are a replicated
            # parameter, whose gradients a sequence-sharded model sums over the ranks like every
            # other: each rank returns its 1/P of the sum, so that sum is exact.
            d_sinks = dsink / ctx.engine.size if ctx.has_sinks else None
            return dq, dk, dv, d_sinks, None


def attention(q, k, v, causal=False, window=0, softmax_scale=None, algo="auto", grid=None,
              comm=None, return_lse=False, layout=None, threads=1, machine=None,
              calibration=None, cu_seqlens=None, sinks=None, softcap=0.0, heads_parallel=None):
    """This rank's shard of softmax(q k^T * scale) v over the whole distributed sequence.

    q: [batch, local tokens, heads, head_dim]; k, v: [batch, local tokens, kv_heads, head_dim]
    (GQA/MQA: heads a multiple of kv_heads), this rank's tokens in layout order
    (attention2d.layout / shard). causal: k <= q; window W > 0 (with causal): q - W < k <= q.
    softmax_scale: default 1/sqrt(head_dim). algo: attention2d, attention2d-overlap, ring,
    allgather-kv, ulysses, hybrid or auto (the cost model's choice); grid: (R, C) for ATTENTION2D,
    or of each heads group for the hybrid; heads_parallel: the hybrid's U (U x R x C = ranks).
    layout: a Layout from attention2d.layout(), whose plan is then used. Collective over comm
    (default MPI.COMM_WORLD): every rank calls it with the same arguments.
    cu_seqlens: packed documents, as flash-attn's varlen [0, l0, l0 + l1, ..., N] of the whole
    sequence (global positions): a query sees only keys of its own document. sinks: per query
    head, a logit [heads] (float32) that joins every row's softmax denominator (gpt-oss); the
    same on every rank; differentiable (each rank's gradient is 1/P of the total, so summing the
    ranks' gradients, as for any replicated parameter, gives it). softcap: scores become
    softcap * tanh(score / softcap) before the mask and the softmax (0: off).

    torch tensors (float32, bfloat16, float16, CPU): differentiable; returns out (and the fp32
    LSE [batch, heads, local tokens] if return_lse). numpy arrays (float32, float16): the
    forward only, returns numpy arrays."""
    comm = _comm(comm)
    error = _check_inputs(q, k, v)
    if not error and window and not causal:
        error = "window=%d needs causal=True (the window is q - window < k <= q)" % window
    if not error and sinks is not None:
        if tuple(sinks.shape) != (q.shape[2],):
            error = "sinks must have shape [heads] = [%d], got %s" % (q.shape[2], list(sinks.shape))
        elif _is_torch(sinks) and sinks.device.type != "cpu":
            error = "sinks are on device %s: attention2d runs on CPU tensors" % sinks.device
    sink_list = None
    if sinks is not None and not error:
        sink_list = [float(x) for x in (sinks.detach().tolist() if _is_torch(sinks)
                                        else np.asarray(sinks).tolist())]
    bounds = None if cu_seqlens is None else tuple(
        int(x) for x in (cu_seqlens.tolist() if hasattr(cu_seqlens, "tolist") else cu_seqlens))
    signature = (bool(causal), int(window or 0), softmax_scale, _algo_name(algo),
                 _grid_text(grid), None if layout is None else layout.plan.describe(),
                 bounds, sink_list, float(softcap or 0.0), heads_parallel)
    if not error:
        b, n, h, d = q.shape
        local = (int(b), int(n), int(h), int(k.shape[2]), int(d), _describe_dtype(q))
    else:
        local = None
    gathered = _raise_collectively(comm, error, (local, signature))
    # Every rank now holds every rank's shapes and arguments and reaches the same verdict.
    first_local, first_signature = gathered[0]
    names = ("causal", "window", "softmax_scale", "algo", "grid", "layout", "cu_seqlens",
             "sinks", "softcap", "heads_parallel")
    for rank, (shapes, sig) in enumerate(gathered):
        for name, mine, theirs in zip(names, first_signature, sig):
            if mine != theirs:
                raise Error("the ranks passed different arguments; every rank must pass the "
                            "same ones: %s is %r on rank 0 and %r on rank %d"
                            % (name, mine, theirs, rank))
        for field, mine, theirs in zip(("batch", "heads", "kv_heads", "head_dim", "dtype"),
                                       first_local[:1] + first_local[2:],
                                       shapes[:1] + shapes[2:]):
            if mine != theirs:
                raise Error("the ranks passed different shapes; %s is %r on rank 0 and %r on "
                            "rank %d" % (field, mine, theirs, rank))
    seq = sum(shapes[1] for shapes, _ in gathered)
    b, _, h, hk, d, dtype = first_local
    problem = _problem(seq, h, d, hk, b, causal, window, softmax_scale, dtype, cu_seqlens,
                       sinks is not None, softcap)
    ranks = comm.Get_size()
    if layout is not None:
        if layout.problem.seq != seq or layout.ranks != ranks:
            raise Error("layout= is for %d tokens on %d ranks, but the shards hold %d tokens on %d "
                        "ranks" % (layout.problem.seq, layout.ranks, seq, ranks))
        chosen = layout.plan
        chosen.threads = int(threads)
    else:
        chosen = _resolve_plan(problem, ranks, algo, grid, machine, calibration, threads,
                               heads_parallel=heads_parallel)
    counts = [len(t) for t in _core.layout_tokens(problem, chosen, ranks)]
    for rank, (shapes, _) in enumerate(gathered):
        if shapes[1] != counts[rank]:
            raise Error("rank %d holds %d tokens, but the layout of %s gives it %d (shard the "
                        "inputs with attention2d.shard(x, attention2d.layout(...)))"
                        % (rank, shapes[1], chosen.describe(), counts[rank]))
    engine = _engine(problem, chosen, comm)

    if _is_torch(q):
        if sinks is not None and not _is_torch(sinks):
            sinks = torch.as_tensor(np.asarray(sinks, dtype=np.float32))
        out, lse = _AttentionFunction.apply(q, k, v, sinks, engine)
        return (out, lse) if return_lse else out
    q, k, v = _engine_ready(q), _engine_ready(k), _engine_ready(v)
    out = np.empty(q.shape, dtype=q.dtype)
    lse = np.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=np.float32)
    sink_values = None if sinks is None else np.ascontiguousarray(sinks, dtype=np.float32)
    engine.forward(_view(q), _view(k), _view(v), _view(out), _view(lse),
                   0 if sink_values is None else sink_values.ctypes.data)
    return (out, lse) if return_lse else out
