"""The pure-Python layer over attention2d._core: argument checks (collective, before any data
moves), plan and engine caching, the torch autograd function, layouts and sharding helpers."""

import atexit
import collections
import math

import numpy as np

from . import _channel, _core
from ._channel import Error, channel, torch
from ._mask import Ranges

_ATTENTION2D_ALGOS = ("attention2d", "attention2d-overlap")
# The layouts a caller may say its shards are in (attention(layout=...), shard(), unshard()).
USER_LAYOUTS = ("contiguous", "zigzag", "cyclic")

# ---------------------------------------------------------------------------------------------
# Messages in the package's words: the C++ core speaks the command line's.

_CLI_WORDS = (
    ("--heads-parallel", "heads_parallel"), ("--algo", "algo"), ("--grid", "grid"),
    ("--doc-lens must sum to --seq", "cu_seqlens must end at the sequence length"),
    ("--doc-lens", "cu_seqlens"), ("--window-size", "window_size"), ("--mask-ranges", "mask"),
    ("--window", "window"), ("--softcap", "softcap"),
    ("--layout", "layout"), ("--dtype", "dtype"), ("--causal", "causal=True"),
    ("--seq", "the sequence length"), ("--device cpu", "CPU tensors"), ("--device", "device"),
)


def _python_words(text):
    for cli, python in _CLI_WORDS:
        text = text.replace(cli, python)
    return text


class _InPythonWords:
    """Re-raises an Error from the core with the command line's flags named as arguments."""

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        if kind is not None and issubclass(kind, Error):
            raise Error(_python_words(str(value))) from None
        return False


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


def _bounds(cu_seqlens):
    """cu_seqlens as a tuple of ints (None stays None)."""
    if cu_seqlens is None:
        return None
    values = cu_seqlens.tolist() if hasattr(cu_seqlens, "tolist") else cu_seqlens
    try:
        return tuple(int(x) for x in values)
    except (TypeError, ValueError):
        raise Error("cu_seqlens must be a list or 1-D tensor of integers, got %r"
                    % (values,)) from None


def _document_lengths(cu_seqlens, seq):
    """Document lengths from flash-attn's cu_seqlens [0, l0, l0 + l1, ..., seq] (None: one
    document), checked in the package's words."""
    bounds = _bounds(cu_seqlens)
    if bounds is None:
        return []
    shown = list(bounds[:8]) + (["..."] if len(bounds) > 8 else [])
    if len(bounds) < 2 or bounds[0] != 0:
        raise Error("cu_seqlens must start at 0 and name at least one document ([0, l0, l0 + l1, "
                    "..., N]), got %s" % shown)
    lengths = [b - a for a, b in zip(bounds[:-1], bounds[1:])]
    for index, length in enumerate(lengths):
        if length < 1:
            raise Error("cu_seqlens must increase strictly (every document needs at least 1 "
                        "token): document %d has %d tokens in %s" % (index, length, shown))
    if bounds[-1] != seq:
        raise Error("cu_seqlens must end at the sequence length, %d (the tokens of all ranks' "
                    "shards), but ends at %d" % (seq, bounds[-1]))
    return lengths


def _as_ranges(mask):
    """mask= as a Ranges (a specification string too), or None."""
    if mask is None or isinstance(mask, Ranges):
        return mask
    if isinstance(mask, str):
        return Ranges(spec=mask)
    raise Error("mask=%r: pass attention2d.ranges(q_ranges, k_ranges, attn_type_map) or a "
                "specification such as 'prefix-lm:1024'" % (mask,))


def _softmax_scale(value):
    """softmax_scale as a float: None means 1/sqrt(head_dim) (the core's 0); anything else must
    be finite and positive (the kernels' scale), or it is refused, never replaced."""
    try:
        scale = float(value)
    except (TypeError, ValueError):
        raise Error("softmax_scale must be None (1/sqrt(head_dim)) or a number, got %r"
                    % (value,)) from None
    if not (math.isfinite(scale) and scale > 0):
        raise Error("softmax_scale=%r: attention2d takes None (1/sqrt(head_dim)) or a finite "
                    "positive scale; 0 (uniform attention) and negative or infinite scales are "
                    "not computed by its kernels" % (value,))
    return scale


def _problem(seq, heads, head_dim, kv_heads=None, batch=1, causal=False, window=0,
             softmax_scale=None, dtype="float32", cu_seqlens=None, sinks=False, softcap=0.0,
             window_size=None, mask=None):
    """window_size: flash-attn's (left, right) or None; mask: a Ranges (attention2d.ranges) or a
    specification string, or None."""
    with _InPythonWords():
        p = _core.Problem()
        p.batch = int(batch)
        p.heads = int(heads)
        p.kv_heads = int(heads if kv_heads is None else kv_heads)
        p.seq = int(seq)
        p.head_dim = int(head_dim)
        if window and not causal:
            raise Error("window=%d needs causal=True (the window is q - window < k <= q)"
                        % window)
        ranges = _as_ranges(mask)
        # The mask through the library's one check of contradictions (flash-attn's meaning:
        # causal makes window_size's right side 0).
        p.set_mask(bool(causal), int(window or 0),
                   None if window_size is None else tuple(int(x) for x in window_size),
                   _document_lengths(cu_seqlens, p.seq),
                   None if ranges is None else ranges.slices(p.seq))
        p.scale = 0.0 if softmax_scale is None else _softmax_scale(softmax_scale)
        p.dtype = _dtype_name(dtype)
        p.sinks = bool(sinks)
        p.softcap = float(softcap or 0.0)
        p.validate()
    return p


def _problem_key(p):
    """Every field of a problem that changes a result (the engine cache's key)."""
    return (p.batch, p.heads, p.kv_heads, p.seq, p.head_dim, p.causal, p.window, p.scale,
            p.dtype, tuple(p.documents), p.sinks, p.softcap, p.window_size, p.mask, p.mask_digest)


def _check_heads_parallel(problem, ranks, heads_parallel, grid):
    u = int(heads_parallel)
    if u < 1:
        raise Error("heads_parallel must be at least 1, got %d" % u)
    if ranks % u:
        raise Error("heads_parallel=%d does not divide the %d ranks (the hybrid runs "
                    "heads_parallel x rows x columns = ranks)" % (u, ranks))
    if problem.heads % u:
        raise Error("heads_parallel=%d must divide the query heads (%d)" % (u, problem.heads))
    if problem.kv_heads % u and u % problem.kv_heads:
        raise Error("heads_parallel=%d must divide the K/V heads (%d) or be a multiple of them"
                    % (u, problem.kv_heads))
    if grid:
        rows, cols = (int(x) for x in grid.split("x"))
        if u * rows * cols != ranks:
            raise Error("heads_parallel=%d times grid=(%d, %d) makes %d ranks, but there are %d"
                        % (u, rows, cols, u * rows * cols, ranks))


def _resolve_plan(problem, ranks, algo="auto", grid=None, machine=None, calibration=None,
                  threads=1, machine_file=None, heads_parallel=None, order=None, shards=None):
    """The plan of a2d run's --algo/--grid/--heads-parallel: the cost model's fastest where not
    pinned down. `order`: (U, R, C) a DeviceMesh fixes; `shards`: the caller's layout (kind,
    counts) whose exchanges the model charges (None or ("plan",): none)."""
    shards_kind, shard_counts = ("", []) if shards is None or shards[0] == "plan" else (
        shards[0], list(shards[1]))
    algo = _algo_name(algo)
    grid = _grid_text(grid)
    if order is not None:
        u, rows, cols = order
        mesh_grid = "%dx%d" % (rows, cols)
        if grid and grid != mesh_grid:
            raise Error("grid=%s, but the DeviceMesh passed as group= is %s" % (grid, mesh_grid))
        if heads_parallel is not None and int(heads_parallel) != u:
            raise Error("heads_parallel=%s, but the DeviceMesh passed as group= has %d heads "
                        "groups" % (heads_parallel, u))
        if algo == "auto":
            algo = "hybrid" if u > 1 else "attention2d"
        if (u > 1) != (algo == "hybrid") or algo not in _ATTENTION2D_ALGOS + ("hybrid",):
            raise Error("a DeviceMesh of %s runs algo='%s', not algo='%s'"
                        % ((u, rows, cols) if u > 1 else (rows, cols),
                           "hybrid" if u > 1 else "attention2d", algo))
        grid, heads_parallel = mesh_grid, (u if u > 1 else None)
    hybrid = algo == "hybrid"
    if heads_parallel is not None and not hybrid:
        raise Error("heads_parallel applies to algo='hybrid' only")
    if heads_parallel is not None:
        _check_heads_parallel(problem, ranks, heads_parallel, grid)
    u = int(heads_parallel or 0)
    with _InPythonWords():
        if grid and hybrid:
            rows, cols = (int(x) for x in grid.split("x"))
            if u == 0:
                if ranks % (rows * cols):
                    raise Error("hybrid: grid=(%d, %d) does not divide the %d ranks"
                                % (rows, cols, ranks))
                u = ranks // (rows * cols)
        elif grid:
            _core.check_grid(grid, ranks)
        grid_matters = algo == "auto" or algo in _ATTENTION2D_ALGOS or hybrid
        # With the caller's shards the planner also weighs running in their layout (Ring,
        # all-gather K/V and Ulysses take any layout): ask it whenever the grid is open.
        if algo == "auto" or (not grid and (grid_matters or shards_kind)):
            chosen, _, _ = _core.choose_plan(
                problem, ranks, ranks, machine or "",
                calibration or _core.default_calibration_file(), machine_file or "",
                "" if algo == "auto" else algo, grid if grid_matters else "", u, shards_kind,
                shard_counts)
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
         heads_parallel=None, group=None, window_size=None, mask=None):
    """The plan attention() uses for this problem on `ranks` ranks (default: the group's or
    communicator's size): an attention2d._core.Plan with .algorithm, .grid (R, C),
    .heads_parallel, .layout, .describe()."""
    order = None
    if ranks is None:
        chan = channel(comm, group)
        ranks, order = chan.size, chan.order
    problem = _problem(seq, heads, head_dim, kv_heads, batch, causal, window, softmax_scale, dtype,
                       cu_seqlens, sinks is not False and sinks is not None, softcap,
                       window_size=_window_size(window_size), mask=mask)
    return _resolve_plan(problem, int(ranks), algo, grid, machine, calibration,
                         heads_parallel=heads_parallel, order=order)


def model(seq, heads, head_dim, kv_heads=None, batch=1, causal=False, window=0,
          softmax_scale=None, dtype="bfloat16", ranks=None, comm=None, ranks_per_node=None,
          machine=None, calibration=None, cu_seqlens=None, softcap=0.0, machine_file=None,
          group=None, shards=None, window_size=None, mask=None):
    """The cost model's predictions for every plan that can run the problem, fastest first: a
    list of dicts (algorithm, grid, layout, forward_s, backward_s, words_forward, ...), as
    `a2d model` prints them (ties within 1 % by less memory first). machine: a preset (a100-hdr,
    h100-ndr), "local" (the calibration file), or None (local if calibrated, else h100-ndr, as
    a2d's default machine; docs/usage.md, "Defaults"); machine_file: a machine description
    file (a2d's --machine-file, docs/cost-model.md), which then decides. shards: the layout the
    caller's shards are in ("contiguous", "zigzag", "cyclic"): plans in another layout are
    charged the exchanges (relayout_forward_s, relayout_backward_s, their bytes)."""
    if shards is not None and shards not in USER_LAYOUTS:
        raise Error("shards=%r: choose one of %s" % (shards, ", ".join(USER_LAYOUTS)))
    if ranks is None:
        ranks = channel(comm, group).size
    ranks = int(ranks)
    problem = _problem(seq, heads, head_dim, kv_heads, batch, causal, window, softmax_scale, dtype,
                       cu_seqlens, False, softcap, window_size=_window_size(window_size),
                       mask=mask)
    with _InPythonWords():
        ranked, _, machine_text = _core.search_plans(
            problem, ranks, int(ranks_per_node or ranks), machine or "",
            calibration or _core.default_calibration_file(), machine_file or "", shards or "", [])
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


def _layout_tokens(kind, seq, ranks, counts=None):
    """Every rank's global token indices (increasing) in a layout: contiguous (balanced, or the
    given counts), zigzag or cyclic."""
    if kind == "contiguous" and counts is not None:
        starts = np.concatenate([[0], np.cumsum(counts)])
        return [np.arange(starts[r], starts[r + 1], dtype=np.int64) for r in range(ranks)]
    return [np.asarray(t, dtype=np.int64) for t in _core.user_layout_tokens(kind, seq, ranks)]


class Layout:
    """Which global tokens each rank's shards hold (in shard order): a plan's layout (from
    attention2d.layout(): .plan, .problem) or one of the layouts callers bring ("contiguous",
    "zigzag", "cyclic": .plan is None)."""

    def __init__(self, problem, chosen, ranks, rank, kind=None, tokens=None):
        self.problem = problem
        self.plan = chosen
        self.ranks = ranks
        self.rank = rank
        self.kind = kind if kind is not None else chosen.layout
        if tokens is None:
            tokens = [np.asarray(t, dtype=np.int64)
                      for t in _core.layout_tokens(problem, chosen, ranks)]
        self._tokens = tokens
        self.seq = int(sum(len(t) for t in tokens))

    def tokens(self, rank=None):
        """Global indices of the tokens `rank` (default: this rank) holds, increasing."""
        return self._tokens[self.rank if rank is None else rank]

    def counts(self):
        return [len(t) for t in self._tokens]

    def __repr__(self):
        if self.plan is None:
            return "Layout(%s, %d tokens on %d ranks: %s)" % (self.kind, self.seq, self.ranks,
                                                              self.counts())
        return "Layout(%s on %d ranks, %s)" % (self.problem.describe(), self.ranks,
                                               self.plan.describe())


def layout(seq, heads=1, head_dim=1, kv_heads=None, batch=1, causal=False, window=0,
           softmax_scale=None, dtype="float32", algo="auto", grid=None, comm=None, plan=None,
           machine=None, calibration=None, cu_seqlens=None, sinks=False, softcap=0.0,
           heads_parallel=None, group=None, kind=None, window_size=None, mask=None):
    """The layout attention() uses for these arguments (pass the result to attention(layout=)
    to pin its plan; shards in it need no exchange): heads, head_dim and dtype matter only when
    the planner chooses. kind="contiguous" | "zigzag" | "cyclic" gives that layout of `seq`
    tokens on the group's ranks instead (no plan)."""
    chan = channel(comm, group)
    if kind is not None:
        if kind not in USER_LAYOUTS:
            raise Error("kind=%r: choose one of %s" % (kind, ", ".join(USER_LAYOUTS)))
        return Layout(None, None, chan.size, chan.rank, kind,
                      _layout_tokens(kind, int(seq), chan.size))
    problem = _problem(seq, heads, head_dim, kv_heads, batch, causal, window, softmax_scale, dtype,
                       cu_seqlens, sinks is not False and sinks is not None, softcap,
                       window_size=_window_size(window_size), mask=mask)
    chosen = plan if plan is not None else _resolve_plan(
        problem, chan.size, algo, grid, machine, calibration, heads_parallel=heads_parallel,
        order=chan.order)
    return Layout(problem, chosen, chan.size, chan.rank)


def _as_layout(spec, seq, chan, counts=None):
    """A Layout from a Layout or a layout name, for `seq` tokens on the channel's ranks."""
    if isinstance(spec, Layout):
        return spec
    if spec not in USER_LAYOUTS:
        raise Error("layout=%r: choose one of %s, or a Layout from attention2d.layout()"
                    % (spec, ", ".join(repr(x) for x in USER_LAYOUTS)))
    return Layout(None, None, chan.size, chan.rank, spec,
                  _layout_tokens(spec, seq, chan.size, counts))


def shard(x, layout, dim=1, comm=None, group=None):
    """This rank's shard of the full tensor x (torch or numpy; tokens along `dim`). layout: a
    Layout, or "contiguous" / "zigzag" / "cyclic" over the ranks of group= (or comm=). Without
    group= a layout name is cut over the DEFAULT group's ranks, not over the group the attention
    runs on: under data x sequence parallelism pass the sequence group here too (or a Layout made
    with group=), else the shards are cut for the wrong number of ranks (attention(positions=...)
    finds such a mismatch)."""
    lay = layout if isinstance(layout, Layout) else _as_layout(layout, x.shape[dim],
                                                               channel(comm, group))
    index = lay.tokens()
    if x.shape[dim] != lay.seq:
        raise Error("shard: x has %d tokens along dim %d but the layout has %d"
                    % (x.shape[dim], dim, lay.seq))
    if torch is not None and isinstance(x, torch.Tensor):
        return x.index_select(dim, torch.from_numpy(index).to(x.device)).contiguous()
    return np.ascontiguousarray(np.take(x, index, axis=dim))


def unshard(x_local, layout, dim=1, comm=None, group=None):
    """Collective: the full tensor from every rank's shard (on every rank). layout: a Layout, or
    "contiguous" (each rank's slice in rank order, any lengths) / "zigzag" / "cyclic"."""
    chan = channel(comm, group)
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
    if isinstance(layout, Layout) and local.shape[dim] != len(layout.tokens()):
        error = "unshard: this rank's tensor has %d tokens along dim %d, the layout gives it %d" % (
            local.shape[dim], dim, len(layout.tokens()))
    parts = chan.raise_collectively(error, local, phase="unshard")
    counts = [part.shape[dim] for part in parts]
    lay = _as_layout(layout, sum(counts), chan, counts)
    if not isinstance(layout, Layout) and lay.counts() != counts:
        raise Error("unshard: the shards hold %s tokens by rank, which is not the %s layout of "
                    "%d tokens (%s)" % (counts, layout, sum(counts), lay.counts()))
    shape = list(local.shape)
    shape[dim] = lay.seq
    full = np.empty(shape, dtype=local.dtype)
    for rank, part in enumerate(parts):
        index = [slice(None)] * len(shape)
        index[dim] = lay.tokens(rank)
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
_CUDA_DTYPES = ("bfloat16", "float16")  # the CUDA kernels are tensor-core kernels
_NUMPY_DTYPES = ("float32", "float16")  # numpy has no bfloat16

# Tests only: the backend that CPU torch tensors run on as if they were CUDA tensors ("fenced-cuda":
# memory only the backend may touch, the CUDA kernels' rules; docs/gpu.md, "CUDA tensors from
# PyTorch"). None in use: CPU tensors run on the CPU backend.
_CPU_STAND_IN = None


def _current_cuda_device():
    return torch.cuda.current_device()


def _device_text(x):
    """The device a tensor's call runs on: "cpu" (numpy, CPU torch tensors) or "cuda:N"."""
    if _is_torch(x) and x.device.type == "cuda":
        return "cuda:%d" % (x.device.index if x.device.index is not None
                            else _current_cuda_device())
    return "cpu"


def _check_devices(tensors, cuda):
    """Where named torch tensors live, as an error text ("" if the call can run them): one device
    for all, CPU or (with `cuda`) the rank's current CUDA device, in a layout the kernels read
    (the last dimension dense). Checked before any data moves."""
    devices = [(name, x.device) for name, x in tensors if _is_torch(x)]
    if not devices:
        return ""
    kinds = {str(d) for _, d in devices}
    if len(kinds) > 1:
        return "%s must be on one device, got %s" % (
            ", ".join(n for n, _ in devices), ", ".join("%s on %s" % (n, d) for n, d in devices))
    name, device = devices[0]
    if device.type == "cpu":
        return ""
    if device.type != "cuda":
        return ("%s is on device %s: attention2d runs CPU and CUDA tensors" % (name, device))
    if not cuda:
        return ("%s is on device %s: this entry runs CPU tensors only (attention2d.Decoder's CUDA "
                "path is not built yet)" % (name, device))
    current = _current_cuda_device()
    if device.index is not None and device.index != current:
        return ("%s is on %s, but this rank's current CUDA device is cuda:%d: attention2d runs "
                "each rank on its current device (torch.cuda.set_device(local_rank) before the "
                "call, or move the tensors there)" % (name, device, current))
    for tensor_name, x in tensors:
        if x.dim() >= 1 and x.shape[-1] > 1 and x.stride(-1) != 1:
            return ("%s (CUDA) has stride %d in its last dimension: the CUDA kernels read rows of "
                    "head_dim contiguous elements; pass %s.contiguous() (no copy is made "
                    "silently on the GPU)" % (tensor_name, x.stride(-1), tensor_name))
    return ""


def _check_inputs(q, k, v, dims=(4,), cuda=False):
    """This rank's problem with its inputs, as an error text ("" if they are fine). cuda: whether
    the entry runs torch CUDA tensors (attention(); attention2d.Decoder does not yet)."""
    tensors = (("q", q), ("k", k), ("v", v))
    kinds = {_is_torch(x) for _, x in tensors}
    if len(kinds) != 1:
        return "q, k and v must all be torch tensors or all numpy arrays"
    placement = _check_devices(tensors, cuda) if _is_torch(q) else ""
    if placement:
        return placement
    for name, x in tensors:
        if _is_torch(x):
            allowed = _CUDA_DTYPES if x.device.type == "cuda" else _TORCH_DTYPES
        else:
            if not isinstance(x, np.ndarray):
                return "%s must be a torch tensor or a numpy array, got %s" % (name, type(x))
            allowed = _NUMPY_DTYPES
        if _describe_dtype(x) not in allowed:
            return "%s has dtype %s; supported%s: %s" % (
                name, _describe_dtype(x), " on CUDA (tensor-core kernels)"
                if allowed is _CUDA_DTYPES else "", ", ".join(allowed))
        if len(x.shape) not in dims:
            return ("%s must have 4 dimensions [batch, local tokens, heads, head_dim]%s, got "
                    "shape %s" % (name, " or 3 [local tokens, heads, head_dim]"
                                  if 3 in dims else "", list(x.shape)))
    if len({len(x.shape) for _, x in tensors}) != 1:
        return "q, k and v must have the same number of dimensions, got %s, %s and %s" % (
            list(q.shape), list(k.shape), list(v.shape))
    if not (_describe_dtype(q) == _describe_dtype(k) == _describe_dtype(v)):
        return "q, k and v must have one dtype, got %s, %s and %s" % (
            _describe_dtype(q), _describe_dtype(k), _describe_dtype(v))
    if len(q.shape) == 3:
        return _check_inputs(q[None], k[None], v[None], cuda=cuda)
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
# Engines: one per (channel, problem, plan, caller's layout), the least recently used dropped

ENGINE_CACHE_SIZE = 8


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
                                device=backend, nccl=nccl)

    return _engines.get(key, make)


@atexit.register
def _release():
    # Before mpi4py finalises MPI (its own atexit hook ran earlier, so it runs later).
    _engines.clear()
    _channel.release()


watchdog = _channel.watchdog


# ---------------------------------------------------------------------------------------------
# The autograd function


def _run_forward(engine, q, k, v, sinks_address, empty, stream=0):
    """O and LSE in the caller's layout; also the plan-layout Q, K, V, O, LSE the backward
    needs (the same tensors when the layouts agree). `empty(shape, dtype)` makes tensors (on the
    inputs' device); `stream`: torch's current CUDA stream there (0 on the CPU)."""
    b, n, h, d = q.shape
    if engine.exchanges:
        m = engine.plan_tokens
        qp, kp, vp = (empty((b, m) + tuple(x.shape[2:]), x.dtype) for x in (q, k, v))
        engine.exchange_in([(_view(x), _view(y)) for x, y in ((q, qp), (k, kp), (v, vp))], [],
                           False, stream)
    else:
        m, qp, kp, vp = n, q, k, v
    op = empty(qp.shape, q.dtype)
    lsep = empty((b, h, m), "float32")
    engine.forward(_view(qp), _view(kp), _view(vp), _view(op), _view(lsep), sinks_address, stream)
    if not engine.exchanges:
        return op, lsep, (qp, kp, vp, op, lsep)
    out = empty(q.shape, q.dtype)
    lse = empty((b, h, n), "float32")
    engine.exchange_out([(_view(op), _view(out))], [(_view(lsep), _view(lse))], False, stream)
    return out, lse, (qp, kp, vp, op, lsep)


def _torch_empty(shape, dtype, device=None):
    """A tensor from torch's allocator (on a CUDA device: its caching allocator, on the current
    stream, which the engine's work is ordered against: _stream_of)."""
    return torch.empty(tuple(shape), dtype=getattr(torch, dtype) if isinstance(dtype, str)
                       else dtype, device=device)


def _torch_empty_on(device):
    return lambda shape, dtype: _torch_empty(shape, dtype, device)


def _stream_of(x):
    """torch's current stream on a CUDA tensor's device as a cudaStream_t (0 for CPU tensors):
    the engine's work waits for what was queued on it and it waits for the engine's (events; no
    host or device-wide synchronisation)."""
    if _is_torch(x) and x.device.type == "cuda":
        return int(torch.cuda.current_stream(x.device).cuda_stream)
    return 0


def _numpy_empty(shape, dtype):
    return np.empty(tuple(shape), dtype=dtype)


if torch is not None:

    class _AttentionFunction(torch.autograd.Function):
        """The engine's forward and backward; saves only N/P-sized shards (in the plan's layout,
        so that the backward moves only dO in and dQ, dK, dV out) and the fp32 LSE."""

        @staticmethod
        def forward(ctx, q, k, v, sinks, engine, chan, lse_wanted):
            q, k, v = _engine_ready(q), _engine_ready(k), _engine_ready(v)
            sink_values = None
            if sinks is not None:  # the kernels read the sinks on the host ([heads] floats)
                sink_values = sinks.detach().to("cpu", torch.float32).contiguous()
            stream = _stream_of(q)
            out, lse, saved = _run_forward(engine, q, k, v, 0 if sink_values is None
                                           else sink_values.data_ptr(), _torch_empty_on(q.device),
                                           stream)
            ctx.sinks_device = None if sinks is None else sinks.device
            ctx.engine = engine
            ctx.chan = chan
            ctx.has_sinks = sinks is not None
            ctx.lse_wanted = lse_wanted
            ctx.user_shapes = (q.shape, k.shape, v.shape)
            ctx.save_for_backward(*saved, sink_values if sink_values is not None
                                  else torch.empty(0))
            if lse_wanted:
                ctx.set_materialize_grads(False)  # an unused output's gradient is None
            else:
                ctx.mark_non_differentiable(lse)  # never returned to the caller
            return out, lse

        @staticmethod
        def backward(ctx, d_out, d_lse):
            if torch.is_grad_enabled():
                raise Error("attention2d's backward is not differentiable itself: "
                            "create_graph=True (double backward, gradient penalties through "
                            "the attention) is not supported")
            engine = ctx.engine
            qp, kp, vp, op, lsep, sink_values = ctx.saved_tensors
            # Whether any rank's LSE carries a gradient (the backward is collective: every rank
            # takes the same path).
            lse_gradient = ctx.lse_wanted and any(ctx.chan.allgather(
                d_lse is not None, "backward arguments"))
            if lse_gradient:
                problem = engine.problem
                refusal = ""
                if ctx.has_sinks or problem.softcap:
                    refusal = ("the gradient through the returned LSE is computed without sinks "
                               "and softcap only: detach the LSE (lse.detach()) or drop %s"
                               % ("sinks" if ctx.has_sinks else "softcap"))
                ctx.chan.raise_collectively(refusal, phase="backward arguments")
            device, stream = qp.device, _stream_of(qp)
            if d_out is None:
                d_out = torch.zeros(ctx.user_shapes[0], dtype=qp.dtype, device=device)
            # autograd's dO may come in any layout: copied where the kernels cannot read it.
            d_out = d_out.to(device=device, dtype=qp.dtype)
            if d_out.dim() >= 1 and d_out.shape[-1] > 1 and d_out.stride(-1) != 1:
                d_out = d_out.contiguous()
            d_out = _engine_ready(d_out)
            if engine.exchanges:
                dop = torch.empty(op.shape, dtype=op.dtype, device=device)
                engine.exchange_in([(_view(d_out), _view(dop))], [], True, stream)
            else:
                dop = d_out
            dqp, dkp, dvp = (torch.empty(x.shape, dtype=x.dtype, device=device)
                             for x in (qp, kp, vp))
            dsink = torch.zeros(sink_values.shape, dtype=torch.float32)  # host: backend.hpp
            engine.backward(_view(qp), _view(kp), _view(vp), _view(op), _view(dop), _view(lsep),
                            _view(dqp), _view(dkp), _view(dvp),
                            sink_values.data_ptr() if ctx.has_sinks else 0,
                            dsink.data_ptr() if ctx.has_sinks else 0, stream)
            if lse_gradient:
                _add_lse_gradient(engine, d_lse, ctx.user_shapes[0][1], qp, kp, vp, op, lsep, dqp,
                                  dkp)
            if engine.exchanges:
                dq, dk, dv = (torch.empty(shape, dtype=qp.dtype, device=device)
                              for shape in ctx.user_shapes)
                engine.exchange_out([(_view(dqp), _view(dq)), (_view(dkp), _view(dk)),
                                     (_view(dvp), _view(dv))], [], True, stream)
            else:
                dq, dk, dv = dqp, dkp, dvp
            # The engine gives every rank the sum over all ranks' rows. The sinks are a replicated
            # parameter, whose gradients a sequence-sharded model sums over the ranks like every
            # other: each rank returns its 1/P of the sum, so that sum is exact.
            d_sinks = (dsink / engine.size).to(ctx.sinks_device) if ctx.has_sinks else None
            return dq, dk, dv, d_sinks, None, None, None

    def _add_lse_gradient(engine, d_lse, user_tokens, qp, kp, vp, op, lsep, dqp, dkp):
        """Adds the LSE's gradient to dQ and dK (plan layout). lse_i = log sum_j exp(s_ij) with
        s_ij = scale q_i . k_j (masked): d lse_i / d q_i = scale (P K)_i, the attention output
        with K as the values (one more forward), and d lse_i / d k_j = scale p_ij q_i, summed over
        i: dV of a backward whose dO is scale * dlse_i * q_i (one more backward)."""
        b, m, h, d = qp.shape
        scale = engine.problem.scale or d ** -0.5
        device, stream = qp.device, _stream_of(qp)
        if d_lse is None:  # this rank's LSE is unused, another rank's is not
            d_lse = torch.zeros((b, h, user_tokens), dtype=torch.float32, device=device)
        d_lse = d_lse.to(device=device, dtype=torch.float32).contiguous()
        if engine.exchanges:
            d_lsep = torch.empty(lsep.shape, dtype=torch.float32, device=device)
            engine.exchange_in([], [(_view(d_lse), _view(d_lsep))], True, stream)
        else:
            d_lsep = d_lse
        weight = (scale * d_lsep).transpose(1, 2).unsqueeze(-1)  # [b, m, h, 1]
        pk = torch.empty(qp.shape, dtype=qp.dtype, device=device)
        # kept alive: the engine writes it
        lse_k = torch.empty(lsep.shape, dtype=torch.float32, device=device)
        engine.forward(_view(qp), _view(kp), _view(kp), _view(pk), _view(lse_k), 0, stream)
        dqp += (weight * pk.float()).to(dqp.dtype)
        d_out = (weight * qp.float()).to(qp.dtype).contiguous()
        scratch = [torch.empty(x.shape, dtype=x.dtype, device=device) for x in (qp, kp, vp)]
        engine.backward(_view(qp), _view(kp), _view(vp), _view(op), _view(d_out), _view(lsep),
                        _view(scratch[0]), _view(scratch[1]), _view(scratch[2]), 0, 0, stream)
        dkp += scratch[2]


    def _backward_in_user_layout(engine, q, k, v, out, lse, d_out, sinks=None):
        """dQ, dK, dV in the caller's layout from the caller's Q, K, V, O, LSE and dO (the
        torch.library op's backward, which saves only the caller's tensors): with a layout
        exchange they go into the plan's layout first (one all-to-all more than the autograd
        function's backward, which saved the plan-layout shards). With sinks ([heads]) also
        dsinks, this rank's 1/P of the total as _AttentionFunction returns it (else None)."""
        q, k, v, out, d_out = (_engine_ready(x) for x in (q, k, v, out, d_out.to(q.dtype)))
        lse = lse.to(torch.float32).contiguous()
        device, stream = q.device, _stream_of(q)
        if engine.exchanges:
            b, h, m = q.shape[0], q.shape[2], engine.plan_tokens
            qp, kp, vp, op, dop = (torch.empty((b, m) + tuple(x.shape[2:]), dtype=x.dtype,
                                               device=device)
                                   for x in (q, k, v, out, d_out))
            lsep = torch.empty((b, h, m), dtype=torch.float32, device=device)
            engine.exchange_in([(_view(x), _view(y)) for x, y in
                                ((q, qp), (k, kp), (v, vp), (out, op), (d_out, dop))],
                               [(_view(lse), _view(lsep))], True, stream)
        else:
            qp, kp, vp, op, dop, lsep = q, k, v, out, d_out, lse
        dqp, dkp, dvp = (torch.empty(x.shape, dtype=x.dtype, device=device)
                         for x in (qp, kp, vp))
        sink_values = dsink = None
        if sinks is not None:  # host arrays, as the autograd function's (backend.hpp)
            sink_values = sinks.detach().to("cpu", torch.float32).contiguous()
            dsink = torch.zeros(sink_values.shape, dtype=torch.float32)
        engine.backward(_view(qp), _view(kp), _view(vp), _view(op), _view(dop), _view(lsep),
                        _view(dqp), _view(dkp), _view(dvp),
                        0 if sinks is None else sink_values.data_ptr(),
                        0 if sinks is None else dsink.data_ptr(), stream=stream)
        d_sinks = (None if sinks is None
                   else (dsink / engine.size).to(device=sinks.device, dtype=sinks.dtype))
        if not engine.exchanges:
            return dqp, dkp, dvp, d_sinks
        dq, dk, dv = (torch.empty(x.shape, dtype=x.dtype, device=device)
                      for x in (q, k, v))
        engine.exchange_out([(_view(dqp), _view(dq)), (_view(dkp), _view(dk)),
                             (_view(dvp), _view(dv))], [], True, stream)
        return dq, dk, dv, d_sinks


# ---------------------------------------------------------------------------------------------
# attention()


def _window_size(window_size):
    """flash-attn's window_size=(left, right) as a tuple, None for None and (-1, -1) (no window)."""
    if window_size is None:
        return None
    try:
        left, right = (int(x) for x in window_size)
    except (TypeError, ValueError):
        raise Error("window_size must be (left, right), got %r" % (window_size,)) from None
    return None if (left, right) == (-1, -1) else (left, right)


def _window_from(window, window_size, causal):
    """Our causal window W (0: none; q - W < k <= q), causal flag and flash-attn's window_size
    (left, right): q - left <= k <= q + right, -1 unbounded on a side (None: no window;
    with causal the right side becomes 0, as in flash-attn)."""
    size = _window_size(window_size)
    if size is not None and window:
        raise Error("pass window= or window_size=, not both")
    return int(window or 0), bool(causal), size


def _user_layout(layout, counts, ranks, seq):
    """The caller's layout as ("plan",) or (kind, counts), or an error text."""
    if isinstance(layout, Layout):
        if layout.plan is None:
            return (layout.kind, tuple(layout.counts())), ""
        return ("plan",), ""
    if layout is None:
        if ranks == 1:
            return ("plan",), ""
        return None, ("with %d ranks, say how the sequence is sharded: layout='contiguous' "
                      "(each rank's slice, in rank order), 'zigzag' (chunks r and 2P-1-r of "
                      "2P), 'cyclic' (token t on rank t mod P), or a Layout from "
                      "attention2d.layout() (the plan's own: no exchange)" % ranks)
    if layout not in USER_LAYOUTS:
        return None, ("layout=%r: choose one of %s, or a Layout from attention2d.layout()"
                      % (layout, ", ".join(repr(x) for x in USER_LAYOUTS)))
    if layout == "contiguous":
        return ("contiguous", tuple(counts)), ""
    expected = [len(t) for t in _layout_tokens(layout, seq, ranks)]
    if expected != list(counts):
        return None, ("the shards hold %s tokens by rank, which is not the %s layout of %d "
                      "tokens on %d ranks (%s)" % (list(counts), layout, seq, ranks, expected))
    return (layout, tuple(counts)), ""


def _check_positions(all_positions, layout, shards, seq, ranks):
    """attention(positions=...): every rank's global token indices against the layout the call
    was told (the same verdict on every rank)."""
    if isinstance(layout, Layout):
        expected = [list(layout.tokens(r)) for r in range(ranks)]
        named = "layout= (%s)" % layout.kind
    elif shards[0] == "plan":  # one rank
        expected = [list(range(seq))]
        named = "one rank"
    else:
        counts = list(shards[1])
        expected = [list(t) for t in _layout_tokens(shards[0], seq, ranks, counts)]
        named = "layout=%r" % shards[0]
    for rank, (got, want) in enumerate(zip(all_positions, expected)):
        if list(got) != [int(t) for t in want]:
            wrong = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
            raise Error("rank %d holds global positions %s... (positions=), but %s of %d tokens "
                        "on %d ranks gives it %s...: its local token %d is position %d, not %d "
                        "(shard with attention2d.shard(x, layout, group=...) over the same group)"
                        % (rank, list(got)[max(0, wrong - 2):wrong + 3], named, seq, ranks,
                           [int(t) for t in want][max(0, wrong - 2):wrong + 3], wrong, got[wrong],
                           want[wrong]))


def _documents_from_positions(all_positions, layout, shards, seq, ranks):
    """The document boundaries [0, ..., seq] of the whole sequence from every rank's positions
    (position_ids, in shard order): each document's positions run 0, 1, ..., l - 1 in the
    global order of the caller's layout (transformers' packed sequences, DataCollatorWithFlattening).
    Anything else is refused (the same verdict on every rank): it means positions that are not
    global, or shards in another layout than the one named."""
    if isinstance(layout, Layout):
        order = [list(layout.tokens(r)) for r in range(ranks)]
    elif shards[0] == "plan":  # one rank
        order = [list(range(seq))]
    else:
        order = [list(t) for t in _layout_tokens(shards[0], seq, ranks, list(shards[1]))]
    if ranks > 1 and all(len(p) > 0 and list(p) == list(range(len(p))) for p in all_positions):
        raise Error("position_ids are 0..n-1 on every rank (the model's default when "
                    "position_ids is not passed): pass position_ids with the global positions of "
                    "each rank's tokens, e.g. attention2d.shard(torch.arange(N)[None], layout) "
                    "(documents that end exactly at every shard boundary look the same and are "
                    "refused too)")
    glob = [0] * seq
    for r in range(ranks):
        for i, t in enumerate(order[r]):
            glob[int(t)] = all_positions[r][i]
    bounds = [0]
    for i, p in enumerate(glob):
        if p == 0 and i > 0:
            bounds.append(i)
        elif p != (glob[i - 1] + 1 if i > 0 else 0):
            rank = next(r for r in range(ranks) if i in order[r])
            raise Error("position_ids: the global token %d (rank %d's local token %d) has position "
                        "%d after %s: each document's positions must run 0, 1, 2, ... in the "
                        "order of layout=%r (packed documents restart at 0); positions that are "
                        "not global, or shards cut in another layout, look like this"
                        % (i, rank, order[rank].index(i), p,
                           "position %d" % glob[i - 1] if i else "the sequence's start",
                           layout.kind if isinstance(layout, Layout) else shards[0]))
    bounds.append(seq)
    return None if len(bounds) == 2 else tuple(bounds)  # one document: no boundaries


def attention(q, k, v, causal=False, window=0, softmax_scale=None, algo="auto", grid=None,
              comm=None, return_lse=False, layout=None, threads=1, machine=None,
              calibration=None, cu_seqlens=None, sinks=None, softcap=0.0, heads_parallel=None,
              group=None, window_size=None, dropout_p=0.0, deterministic=None,
              return_attn_probs=False, mask=None, positions=None, _refusal="", _documents=False,
              _engine_only=False):
    """This rank's shard of softmax(q k^T * scale) v over the whole distributed sequence.

    q: [batch, local tokens, heads, head_dim] (or 3-D [local tokens, heads, head_dim], flash-attn's
    packed "thd", batch 1); k, v: the same with kv_heads (GQA/MQA: heads a multiple of kv_heads).
    group: a torch.distributed ProcessGroup (or DeviceMesh); comm: an mpi4py communicator;
    neither: torch.distributed's default group where initialised, else MPI.COMM_WORLD.
    layout: how the ranks' shards cut the sequence: "contiguous" (each rank's slice in rank
    order; any lengths), "zigzag" (chunks r and 2P-1-r of 2P), "cyclic", or a Layout from
    attention2d.layout() (the plan's own layout, which needs no exchange). With more than one
    rank it must be given. Shards in another layout than the plan's are exchanged into it
    inside (one all-to-all each way) and the results come back in the caller's layout.
    causal: k <= q; window W > 0 (with causal): q - W < k <= q; or flash-attn's
    window_size=(left, right): q - left <= k <= q + right, -1 unbounded on a side ((W - 1, 0) is
    window W; with causal the right side is 0, as in flash-attn). mask: a range mask,
    attention2d.ranges(q_ranges, k_ranges, attn_type_map) as MagiAttention's
    flex_flash_attn_func takes them, or a specification ("prefix-lm:1024", "block-causal:256",
    "random:64"); not with causal, a window or cu_seqlens. A row that sees no key gets O = 0 and
    LSE = -inf (zero gradients). softmax_scale: default 1/sqrt(head_dim). algo: attention2d,
    attention2d-overlap, ring, allgather-kv, ulysses, hybrid or auto (the cost model's choice);
    grid: (R, C) for ATTENTION2D, or of each heads group for the hybrid; heads_parallel: the
    hybrid's U (U x R x C = ranks). cu_seqlens: packed documents, flash-attn's varlen
    [0, l0, l0 + l1, ..., N] of the whole sequence (global positions). sinks: per query head, a
    logit [heads] (float32) joining every row's softmax denominator (gpt-oss); differentiable
    (each rank's gradient is 1/P of the total). softcap: scores become softcap * tanh(s /
    softcap). dropout_p must be 0 (exact attention); deterministic is accepted: results are
    always bitwise reproducible for the same inputs, plan, ranks, threads and transport.

    torch tensors (float32, bfloat16, float16, CPU): differentiable; returns out, (out, lse) with
    return_lse, or (out, lse, None) with return_attn_probs (flash-attn's shape; no
    probabilities). numpy arrays (float32, float16): the forward only. The LSE returned with
    return_lse / return_attn_probs is differentiable (its gradient costs one more forward and
    backward; refused with sinks or softcap).

    positions: optional, this rank's global token indices in shard order (e.g. the positions a
    model's rotary embedding uses); each call then checks them against layout= on every rank
    and refuses a mismatch (an all-gather of N integers: for debugging). Without it only the
    ranks' token counts are checked, which contiguous and zigzag shards share for most N."""
    chan = channel(comm, group)
    error = _refusal or _check_inputs(q, k, v, dims=(3, 4), cuda=True)
    thd = not error and len(q.shape) == 3
    if thd:
        q, k, v = q[None], k[None], v[None]
    ranges = None
    try:
        window, causal, window_size = _window_from(window, window_size, causal)
        ranges = _as_ranges(mask)
        if dropout_p:
            raise Error("dropout_p=%s: attention2d computes exact attention without dropout; "
                        "dropout_p must be 0.0" % dropout_p)
    except Error as e:
        error = error or str(e)
    if not error and window and not causal:
        error = "window=%d needs causal=True (the window is q - window < k <= q)" % window
    if not error and softmax_scale is not None:
        try:
            _softmax_scale(softmax_scale)
        except Error as e:
            error = str(e)
    if not error and sinks is not None:
        if tuple(sinks.shape) != (q.shape[2],):
            error = "sinks must have shape [heads] = [%d], got %s" % (q.shape[2], list(sinks.shape))
        elif _is_torch(sinks) and sinks.device.type not in ("cpu", str(q.device.type)):
            error = ("sinks are on device %s, q on %s: pass them on q's device or the CPU"
                     % (sinks.device, q.device))
    sink_list = None
    if sinks is not None and not error:
        sink_list = [float(x) for x in (sinks.detach().tolist() if _is_torch(sinks)
                                        else np.asarray(sinks).tolist())]
    try:
        bounds = _bounds(cu_seqlens)
    except Error as e:
        error, bounds = error or str(e), None
    layout_spec = (layout.plan.describe() if isinstance(layout, Layout) and layout.plan
                   else (layout.kind, tuple(layout.counts())) if isinstance(layout, Layout)
                   else layout)
    signature = (bool(causal), int(window or 0), softmax_scale, _algo_name(algo),
                 _grid_text(grid), layout_spec, bounds, sink_list, float(softcap or 0.0),
                 heads_parallel, window_size, None if ranges is None else ranges.key(),
                 positions is not None)
    local = None
    my_positions = None
    if not error and positions is not None:
        try:
            my_positions = [int(x) for x in (positions.tolist() if hasattr(positions, "tolist")
                                             else positions)]
        except (TypeError, ValueError):
            error = "positions must be a 1-D list or tensor of this rank's global token indices"
        if not error and len(my_positions) != q.shape[-3]:
            error = ("positions has %d entries for %d local tokens (one global index per token "
                     "of this rank's shard, in shard order)" % (len(my_positions), q.shape[-3]))
    if not error:
        b, n, h, d = q.shape[-4:] if len(q.shape) == 4 else (1,) + tuple(q.shape)
        local = (int(b), int(n), int(h), int(k.shape[-2]), int(d), _describe_dtype(q),
                 _device_text(q).split(":")[0])
    gathered = chan.raise_collectively(error, ((local, signature), my_positions),
                                       phase="attention() arguments")
    all_positions = [p for _, p in gathered]
    gathered = [g for g, _ in gathered]
    # Every rank now holds every rank's shapes and arguments and reaches the same verdict.
    first_local, first_signature = gathered[0]
    names = ("causal", "window", "softmax_scale", "algo", "grid", "layout", "cu_seqlens",
             "sinks", "softcap", "heads_parallel", "window_size", "mask",
             "positions (given or not)")
    for rank, (shapes, sig) in enumerate(gathered):
        for name, mine, theirs in zip(names, first_signature, sig):
            if mine != theirs:
                raise Error("the ranks passed different arguments; every rank must pass the "
                            "same ones: %s is %r on rank 0 and %r on rank %d"
                            % (name, mine, theirs, rank))
        for field, mine, theirs in zip(("batch", "heads", "kv_heads", "head_dim", "dtype",
                                        "device type"),
                                       first_local[:1] + first_local[2:],
                                       shapes[:1] + shapes[2:]):
            if mine != theirs:
                what = {"dtype": "dtypes", "device type": "devices"}.get(field, "shapes")
                raise Error("the ranks passed different %s; %s is %r on rank 0 and %r on "
                            "rank %d" % (what, field, mine, theirs, rank))
    counts = [shapes[1] for shapes, _ in gathered]
    seq = sum(counts)
    ranks = chan.size
    if isinstance(layout, Layout):
        if layout.ranks != ranks:
            raise Error("layout= is for %d ranks, but the call runs on %d" % (layout.ranks, ranks))
        wrong = [r for r in range(ranks) if counts[r] != layout.counts()[r]]
        if wrong:
            r = wrong[0]
            raise Error("rank %d holds %d tokens, but layout= (%d tokens on %d ranks) gives it %d"
                        "%s (shard the inputs with attention2d.shard(x, layout))"
                        % (r, counts[r], layout.seq, ranks, layout.counts()[r],
                           "" if len(wrong) == 1 else "; ranks %s differ too" % wrong[1:]))
    shards, error = _user_layout(layout, counts, ranks, seq)
    if error:
        raise Error(error)
    if positions is not None and _documents:
        # attention2d.transformers: the documents are where the global positions restart at 0.
        if cu_seqlens is not None:
            raise Error("pass cu_seqlens or documents from positions, not both")
        bounds = _documents_from_positions(all_positions, layout, shards, seq, ranks)
    elif positions is not None:
        _check_positions(all_positions, layout, shards, seq, ranks)
    b, _, h, hk, d, dtype, _ = first_local
    problem = _problem(seq, h, d, hk, b, causal, window, softmax_scale, dtype, bounds,
                       sinks is not None, softcap, window_size=window_size, mask=ranges)
    if isinstance(layout, Layout) and layout.plan is not None:
        chosen = layout.plan
        pinned = {"algo": (_algo_name(algo), "auto", chosen.algorithm),
                  "grid": (_grid_text(grid), "", _grid_text(chosen.grid)),
                  "heads_parallel": (heads_parallel, None, chosen.heads_parallel)}
        for name, (given, unset, planned) in pinned.items():
            if given != unset and given != planned:
                raise Error("layout= was made for the plan %s, but %s=%r: the shards' layout "
                            "fixes the plan (make the layout with the same %s)"
                            % (chosen.describe(), name, given, name))
        chosen.threads = int(threads)
    else:
        chosen = _resolve_plan(problem, ranks, algo, grid, machine, calibration, threads,
                               heads_parallel=heads_parallel, order=chan.order, shards=shards)
    engine = _engine(chan, problem, chosen, shards, _device_text(q))
    if _engine_only:
        return engine

    if _is_torch(q):
        if sinks is not None and not _is_torch(sinks):
            sinks = torch.as_tensor(np.asarray(sinks, dtype=np.float32))
        out, lse = _AttentionFunction.apply(q, k, v, sinks, engine, chan,
                                            bool(return_lse or return_attn_probs))
    else:
        q, k, v = _engine_ready(q), _engine_ready(k), _engine_ready(v)
        sink_values = None if sinks is None else np.ascontiguousarray(sinks, dtype=np.float32)
        out, lse, _ = _run_forward(engine, q, k, v, 0 if sink_values is None
                                   else sink_values.ctypes.data, _numpy_empty)
    if thd:
        out, lse = out[0], lse[0]
    if return_attn_probs:
        return out, lse, None
    return (out, lse) if return_lse else out
