"""Problems and plans: the arguments as the core's Problem (checked in the package's words) and
the planner's choice (plan(), model()); messages of the C++ core translated from the command
line's flags into the package's arguments."""

import math

from . import _core
from ._channel import Error, channel, is_grid_mesh, planner_grid
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


def _varlen_refusal(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    """flash_attn_varlen_func's own arguments checked ("" if fine): one packed sequence for queries
    and keys (self-attention), max_seqlen_* at least the longest document."""
    try:
        bounds_q, bounds_k = _bounds(cu_seqlens_q), _bounds(cu_seqlens_k)
    except Error as e:
        return str(e)
    if bounds_q is None or bounds_k is None:
        return "cu_seqlens_q and cu_seqlens_k are needed"
    if bounds_q != bounds_k:
        return ("cu_seqlens_q and cu_seqlens_k differ: attention2d computes self-attention of one "
                "packed sequence (the same documents for queries and keys)")
    longest = max((b - a for a, b in zip(bounds_q[:-1], bounds_q[1:])), default=0)
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if value is not None and int(value) < longest:
            return ("%s=%d is shorter than the longest document (%d tokens) in cu_seqlens"
                    % (name, int(value), longest))
    return ""


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
                  threads=1, machine_file=None, heads_parallel=None, order=None, shards=None,
                  slots=None):
    """The plan of a2d run's --algo/--grid/--heads-parallel: the cost model's fastest where not
    pinned down. `order`: (U, R, C) a grid DeviceMesh fixes; `shards`: the caller's layout (kind,
    counts) whose exchanges the model charges (None or ("plan",): none); `slots`: the caller's
    rank of each engine rank (Channel.slots; None: the same)."""
    shards_kind, shard_counts = ("", []) if shards is None or shards[0] == "plan" else (
        shards[0], list(shards[1]))
    algo = _algo_name(algo)
    grid = _grid_text(grid)
    if order is not None:
        u, rows, cols = order
        mesh_grid = "%dx%d" % (rows, cols)
        if grid and grid != mesh_grid:
            raise Error("grid=%s, but the DeviceMesh passed as grid= is %s" % (grid, mesh_grid))
        if heads_parallel is not None and int(heads_parallel) != u:
            raise Error("heads_parallel=%s, but the DeviceMesh passed as grid= has %d heads "
                        "groups" % (heads_parallel, u))
        if algo == "auto":
            algo = "hybrid" if u > 1 else "attention2d"
        if (u > 1) != (algo == "hybrid") or algo not in _ATTENTION2D_ALGOS + ("hybrid",):
            raise Error("a DeviceMesh of %s runs algo='%s', not algo='%s'"
                        % ((u, rows, cols) if u > 1 else (rows, cols),
                           "hybrid" if u > 1 else "attention2d", algo))
        grid, heads_parallel = mesh_grid, (u if u > 1 else None)
    if heads_parallel is not None and algo != "hybrid":
        raise Error("heads_parallel applies to algo='hybrid' only")
    if heads_parallel is not None:
        _check_heads_parallel(problem, ranks, heads_parallel, grid)
    # The rest is the library's (resolve_plan, as a2d run resolves its options); the checks above
    # name this call's own arguments.
    with _InPythonWords():
        return _core.resolve_plan(
            problem, ranks, "" if algo == "auto" else algo, grid, int(heads_parallel or 0),
            int(threads), machine or "", calibration or _core.default_calibration_file(),
            machine_file or "", shards_kind, shard_counts,
            list(slots or []) if shards_kind else [])


def plan(seq, heads, head_dim, kv_heads=None, batch=1, causal=False, window=0,
         softmax_scale=None, dtype="float32", algo="auto", grid=None, ranks=None, comm=None,
         machine=None, calibration=None, cu_seqlens=None, sinks=False, softcap=0.0,
         heads_parallel=None, group=None, window_size=None, mask=None):
    """The plan attention() uses for this problem on `ranks` ranks (default: the group's or
    communicator's size): an attention2d._core.Plan with .algorithm, .grid (R, C),
    .heads_parallel, .layout, .describe()."""
    order = None
    if ranks is None or is_grid_mesh(grid):
        chan = channel(comm, group, grid)
        ranks, order, grid = chan.size, chan.order, planner_grid(grid)
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


def _window_size(window_size):
    """flash-attn's window_size=(left, right) as a tuple, None for None and (-1, -1) (no window)."""
    if window_size is None:
        return None
    try:
        left, right = (int(x) for x in window_size)
    except (TypeError, ValueError):
        raise Error("window_size must be (left, right), got %r" % (window_size,)) from None
    return None if (left, right) == (-1, -1) else (left, right)
