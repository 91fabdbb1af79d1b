"""attention(): the arguments checked on every rank (the same verdict everywhere, before any data
moves), the plan and the engine, then the autograd function (torch) or the forward (numpy). The
package's other pieces: _planning (problems and plans), _sharding (layouts and shards), _tensors
(what crosses into the engine), _engine_cache, _autograd."""

import numpy as np

from . import _positions
from ._autograd import _run_forward
from ._channel import Error, channel, planner_grid, torch
from ._engine_cache import _engine
from ._planning import (USER_LAYOUTS, _algo_name, _as_ranges, _bounds, _grid_text, _problem,
                        _resolve_plan, _softmax_scale, _varlen_refusal, _window_size)
from ._sharding import (Layout, _check_positions, _documents_from_positions, _layout_tokens,
                        _user_layout)
from ._tensors import (_check_inputs, _describe_dtype, _device_text, _engine_ready, _is_torch,
                       _numpy_empty, _stream_of, _torch_empty_on)

if torch is not None:
    # _backward_in_user_layout: attention2d.transformers' op backward calls it from here
    # (_api._backward_in_user_layout; bench/python/hf_step.py wraps it here to time it).
    from ._autograd import _AttentionFunction, _backward_in_user_layout  # noqa: F401
    from . import _ops

# What attention2d.transformers reads of this module.
__all__ = ["USER_LAYOUTS", "Layout", "attention"]

# ---------------------------------------------------------------------------------------------
# attention()


def _window_from(window, window_size, causal):
    """Our causal window W (0: none; q - W < k <= q), causal flag and flash-attn's window_size
    (left, right): q - left <= k <= q + right, -1 unbounded on a side (None: no window;
    with causal the right side becomes 0, as in flash-attn)."""
    size = _window_size(window_size)
    if size is not None and window:
        raise Error("pass window= or window_size=, not both")
    return int(window or 0), bool(causal), size


# The orders attention() takes its tensors in (qkv_format=): flash-attn's and SDPA's.
QKV_FORMATS = ("bshd", "bhsd")


def _format_refusal(qkv_format, q):
    """qkv_format= checked on this rank ("" if fine)."""
    if qkv_format is None or qkv_format == "bshd":
        return ""
    if qkv_format not in QKV_FORMATS:
        return ("qkv_format=%r: choose 'bshd' ([batch, tokens, heads, head_dim], flash-attn's "
                "order) or 'bhsd' ([batch, heads, tokens, head_dim], torch SDPA's)"
                % (qkv_format,))
    if len(getattr(q, "shape", ())) != 4:
        return ("qkv_format='bhsd' takes 4-D tensors [batch, heads, tokens, head_dim], got q of "
                "shape %s" % list(getattr(q, "shape", [])))
    return ""


def _swap_tokens_and_heads(x):
    """A view of a 4-D torch tensor or numpy array with dimensions 1 and 2 swapped."""
    return x.transpose(1, 2) if _is_torch(x) else np.swapaxes(x, 1, 2)


def _sdpa_hint(qkv_format):
    return ("" if qkv_format is not None else
            " (tensors in torch SDPA's order [batch, heads, tokens, head_dim]? pass "
            "qkv_format='bhsd')")


def _check_order(gathered, qkv_format):
    """Without qkv_format=, the mistake of tensors in SDPA's order [batch, heads, tokens,
    head_dim] read as [batch, tokens, heads, head_dim]. With GQA it fails the shape checks (k's
    "tokens" are its heads); with as many K/V heads as query heads it passes them, and then every
    rank's "token count" is the head count (the same on every rank) and no larger than its "head
    count" (its real tokens), which real shards almost never are. Refused then, on every rank,
    unless the caller says which order it is. (Where the real shards hold fewer tokens than there
    are heads, the two orders have the same shapes: nothing tells them apart.)"""
    if qkv_format is not None:
        return
    shapes = gathered[0][0]
    heads, kv_heads = shapes[2], shapes[3]
    counts = {s[1] for s, _, _ in gathered}
    if heads == kv_heads and len(counts) == 1 and shapes[1] <= heads:
        raise Error("q, k and v have shape [batch, tokens, heads, head_dim] = %s on every rank: "
                    "no more tokens than heads, the same on every rank, which is what tensors in "
                    "torch SDPA's order [batch, heads, tokens, head_dim] look like. Pass "
                    "qkv_format='bhsd' for SDPA's order, or qkv_format='bshd' to say these are "
                    "flash-attn's [batch, tokens, heads, head_dim]"
                    % [shapes[0], shapes[1], shapes[2], shapes[4]])


def attention(q, k, v, causal=False, window=0, softmax_scale=None, algo="auto", grid=None,
              comm=None, return_lse=False, layout=None, threads=1, machine=None,
              calibration=None, cu_seqlens=None, sinks=None, softcap=0.0, heads_parallel=None,
              group=None, window_size=None, dropout_p=0.0, deterministic=None,
              return_attn_probs=False, mask=None, positions=None, qkv_format=None,
              key_padding=None, _refusal="",
              _documents=False, _engine_only=False, _varlen=None, _in_op=False):
    """This rank's shard of softmax(q k^T * scale) v over the whole distributed sequence.

    q: [batch, local tokens, heads, head_dim] (or 3-D [local tokens, heads, head_dim], flash-attn's
    packed "thd", batch 1); k, v: the same with kv_heads (GQA/MQA: heads a multiple of kv_heads).
    qkv_format: "bshd" (that order, flash-attn's) or "bhsd" (torch SDPA's [batch, heads, local
    tokens, head_dim]; the output comes back in it too); None: "bshd", but tensors that look like
    SDPA's order (as many K/V heads as query heads, and no more tokens than heads, the same
    number on every rank) are refused on every rank.
    group: a torch.distributed ProcessGroup or 1-D DeviceMesh (the sequence-parallel ranks; a mesh
    of more dimensions is refused: pass mesh["cp"]); comm: an mpi4py communicator; neither:
    torch.distributed's default group where initialised, else MPI.COMM_WORLD. grid: (R, C), or a
    2-D DeviceMesh (rows x columns of ATTENTION2D's grid laid on its dimensions; 3-D: heads
    groups x rows x columns of the hybrid), whose ranks are then the call's. Ranks are counted
    as torch counts them (a mesh's: its flattened group's).
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
    and refuses a mismatch (each rank reads its own, O(N/P); the same tensor again is not read
    again). Without it only the ranks' token counts are checked, which contiguous and zigzag
    shards share for most N.

    key_padding: a padded batch, [batch, local tokens] (True or 1: a real token, False or 0:
    padding; transformers' attention_mask sharded like q), each row padded at its end or at its
    start (its own number of pads): a row's padded keys are hidden from its real queries, and
    padded queries' outputs are 0 (LSE -inf, zero gradients). Rows of the same padding run in
    one call. torch tensors only, not with cu_seqlens, mask= or torch.compile.

    Under torch.compile the call is one torch.library op, attention2d::attention (its fake
    implementation and autograd registered: _ops.py), and a block calling it compiles into one
    graph."""
    if not _in_op and _is_torch(q) and torch.compiler.is_compiling():
        if key_padding is not None:
            raise Error("key_padding= under torch.compile: attention2d serves padded batches in "
                        "eager mode only; call it outside the compiled region")
        return _ops.compiled_attention(
            q, k, v, causal=causal, window=window, softmax_scale=softmax_scale, algo=algo,
            grid=grid, comm=comm, return_lse=return_lse, layout=layout, threads=threads,
            machine=machine, calibration=calibration, cu_seqlens=cu_seqlens, sinks=sinks,
            softcap=softcap, heads_parallel=heads_parallel, group=group,
            window_size=window_size, dropout_p=dropout_p, return_attn_probs=return_attn_probs,
            mask=mask, positions=positions, qkv_format=qkv_format, refusal=_refusal,
            varlen=_varlen)
    chan = channel(comm, group, grid)
    grid = planner_grid(grid)
    error = _refusal or (_varlen_refusal(cu_seqlens, *_varlen) if _varlen else "")
    error = error or _format_refusal(qkv_format, q)
    sdpa = not error and qkv_format == "bhsd"
    if sdpa:  # views in flash-attn's order (the engine reads any strides)
        q, k, v = _swap_tokens_and_heads(q), _swap_tokens_and_heads(k), _swap_tokens_and_heads(v)
    error = error or _check_inputs(q, k, v, dims=(3, 4), cuda=True)
    if error and qkv_format is None and "with q's batch" in error:
        error += _sdpa_hint(qkv_format)
    thd = not error and len(q.shape) == 3
    if thd:
        q, k, v = q[None], k[None], v[None]
    if not error and key_padding is not None:
        error = _key_padding_refusal(key_padding, q, thd, cu_seqlens)
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
    mode = None if positions is None else ("documents" if _documents else "check")
    signature = (bool(causal), int(window or 0), softmax_scale, _algo_name(algo),
                 _grid_text(grid), layout_spec, bounds, sink_list, float(softcap or 0.0),
                 heads_parallel, window_size, None if ranges is None else ranges.key(),
                 mode, qkv_format, key_padding is not None)
    local = None
    my_positions = None
    if not error and positions is not None:
        my_positions, error = _positions.read_positions(
            positions, (q.shape[-3], q.shape[-2]), _sdpa_hint(qkv_format))
    if not error:
        b, n, h, d = q.shape[-4:] if len(q.shape) == 4 else (1,) + tuple(q.shape)
        local = (int(b), int(n), int(h), int(k.shape[-2]), int(d), _describe_dtype(q),
                 _device_text(q).split(":")[0])
    same_positions = mode is not None and _positions.unchanged(chan, mode, my_positions)
    gathered = chan.raise_collectively(error, (local, signature, same_positions),
                                       phase="attention() arguments")
    # Every rank now holds every rank's shapes and arguments and reaches the same verdict.
    first_local, first_signature, _ = gathered[0]
    names = ("causal", "window", "softmax_scale", "algo", "grid", "layout", "cu_seqlens",
             "sinks", "softcap", "heads_parallel", "window_size", "mask",
             "positions (given or not)", "qkv_format", "key_padding (given or not)")
    for rank, (shapes, sig, _) in enumerate(gathered):
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
                            "rank %d%s" % (what, field, mine, theirs, rank,
                                           _sdpa_hint(qkv_format) if field == "heads" else ""))
    _check_order(gathered, qkv_format)
    counts = [shapes[1] for shapes, _, _ in gathered]
    seq = sum(counts)
    ranks = chan.size
    if isinstance(layout, Layout):
        if layout.ranks != ranks:
            raise Error("layout= is for %d ranks, but the call runs on %d" % (layout.ranks, ranks))
        if layout.plan is not None and (layout.slots or None) != chan.slots:
            raise Error("layout= was made over %s, but the call runs over %s, whose ranks take "
                        "other places in the plan: make the layout with the call's group= or "
                        "grid=" % ("a grid= DeviceMesh" if layout.slots else "a group",
                                   chan.label))
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
    if mode is not None:
        if mode == "documents" and cu_seqlens is not None:
            raise Error("pass cu_seqlens or documents from positions, not both")
        # attention2d.transformers: the documents are where the global positions restart at 0.
        slow = _documents_from_positions if mode == "documents" else _check_positions
        found = _positions.resolve(
            chan, mode, my_positions, [same for _, _, same in gathered], layout,
            shards, counts, seq, lambda everyone: slow(everyone, layout, shards, seq, ranks))
        if mode == "documents":
            if found is not None and ranges is not None:
                raise Error("packed documents (position_ids restarting at 0) with a range mask "
                            "(chunked attention): attention2d does not intersect the two; pack "
                            "one document per sequence")
            bounds = found
    groups = None if key_padding is None else _padding_groups(
        key_padding.detach().to("cpu").bool(), chan, layout, counts, seq)
    if groups is not None:  # some row is padded (else: the call as without key_padding)
        _padding_refusal(bounds, sinks, ranges)
        out, lse = _padded_attention(
            q, k, v, key_padding, groups,
            dict(causal=causal, window=window, softmax_scale=softmax_scale, algo=algo, grid=grid,
                 comm=comm, layout=layout, threads=threads, machine=machine,
                 calibration=calibration, sinks=sinks, softcap=softcap,
                 heads_parallel=heads_parallel, group=group, window_size=window_size,
                 positions=positions, qkv_format="bshd"))
        if sdpa:
            out = _swap_tokens_and_heads(out)
        if return_attn_probs:
            return out, lse, None
        return (out, lse) if return_lse else out
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
                               heads_parallel=heads_parallel, order=chan.order, shards=shards,
                               slots=chan.slots)
    engine = _engine(chan, problem, chosen, shards, _device_text(q))
    if _engine_only:
        return engine

    if _is_torch(q) and _in_op:  # the op's forward: autograd is the op's (_ops.py)
        q, k, v = _engine_ready(q), _engine_ready(k), _engine_ready(v)
        sink_values = (None if sinks is None else  # kept alive: the engine reads it
                       sinks.detach().to("cpu", torch.float32).contiguous())
        out, lse, _ = _run_forward(engine, q, k, v, 0 if sinks is None
                                   else sink_values.data_ptr(), _torch_empty_on(q.device),
                                   _stream_of(q))
    elif _is_torch(q):
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
    if sdpa:
        out = _swap_tokens_and_heads(out)
    if _in_op:
        return out, lse
    if return_attn_probs:
        return out, lse, None
    return (out, lse) if return_lse else out


def _key_padding_refusal(key_padding, q, thd, cu_seqlens):
    """What is wrong with attention(key_padding=...) on this rank ("" if nothing). What it may
    not meet (packed documents, a range mask, sinks) is refused only where a row is padded
    (_padding_refusal: the same verdict on every rank)."""
    if not _is_torch(key_padding) or not _is_torch(q):
        return "key_padding must be a torch tensor, with torch q, k, v"
    if thd or cu_seqlens is not None:
        return ("key_padding= pads a batch of sequences: not with packed documents (cu_seqlens, "
                "the 3-D 'thd' format)")
    if tuple(key_padding.shape) != tuple(q.shape[:2]):
        return ("key_padding has shape %s; it must be [batch, local tokens] = %s, this rank's "
                "shard of the padding mask" % (list(key_padding.shape), list(q.shape[:2])))
    if key_padding.dtype != torch.bool and (key_padding.is_floating_point()
                                            or key_padding.is_complex()):
        return "key_padding must be bool or integer (1: a real token, 0: padding), got %s" % (
            key_padding.dtype)
    if key_padding.dtype != torch.bool and not bool(((key_padding == 0) |
                                                     (key_padding == 1)).all()):
        return "key_padding holds values other than 0 and 1"
    return ""


def _my_tokens(chan, layout, counts, seq):
    """This rank's global token indices in the caller's layout."""
    if isinstance(layout, Layout):
        return np.asarray(layout.tokens(), dtype=np.int64)
    return _layout_tokens(layout or "contiguous", seq, chan.size,
                          counts if layout in (None, "contiguous") else None)[chan.rank]


def _padding_groups(real, chan, layout, counts, seq):
    """The batch's rows grouped by their padding: [(cu_seqlens bounds, or None for rows without
    padding; [rows])], rows of padding only left out; None when no row is padded. From every
    rank's shard of the mask (one all-gather of per-row counts and extremes; the same verdict on
    every rank)."""
    positions = torch.from_numpy(_my_tokens(chan, layout, counts, seq))
    stats = []
    for row in real:
        kept, padded = positions[row], positions[~row]
        stats.append((int(row.sum()), int(kept.min()) if len(kept) else seq,
                      int(kept.max()) if len(kept) else -1,
                      int(padded.min()) if len(padded) else seq,
                      int(padded.max()) if len(padded) else -1))
    gathered = chan.raise_collectively("", stats, phase="key_padding")
    groups = {}
    for b in range(len(stats)):
        rows = [every[b] for every in gathered]
        kept = sum(r[0] for r in rows)
        first_kept, last_kept = min(r[1] for r in rows), max(r[2] for r in rows)
        first_pad, last_pad = min(r[3] for r in rows), max(r[4] for r in rows)
        if kept == seq:
            bounds = None
        elif kept == 0:
            bounds = "empty"
        elif last_kept < first_pad:  # padded at the end
            bounds = (0, kept, seq)
        elif last_pad < first_kept:  # padded at the start
            bounds = (0, seq - kept, seq)
        else:
            raise Error("key_padding: row %d of the batch has padding between its tokens (real "
                        "tokens at global positions %d..%d, padding at %d..%d); attention2d "
                        "serves rows padded at their end or at their start"
                        % (b, first_kept, last_kept, first_pad, last_pad))
        groups.setdefault(bounds, []).append(b)
    if list(groups) == [None]:
        return None
    return [(bounds, groups[bounds]) for bounds in
            sorted(groups, key=lambda x: (x is not None, str(x))) if bounds != "empty"]


def _padding_refusal(bounds, sinks, ranges):
    """What a padded batch does not meet, raised on every rank (every rank found the padding)."""
    if bounds is not None and len(bounds) > 2:
        raise Error("a padded batch (key_padding, or transformers' attention_mask with zeros) "
                    "with packed documents (position_ids restarting at 0): attention2d serves "
                    "one or the other; pack without padding, or pad without packing")
    if ranges is not None:
        raise Error("a padded batch (key_padding, or transformers' attention_mask with zeros) "
                    "with a range mask (mask=, chunked attention): attention2d does not serve "
                    "the two together")
    if sinks is not None:
        raise Error("a padded batch (key_padding, or transformers' attention_mask with zeros) "
                    "with attention sinks: a padded query's softmax would hold the sink alone; "
                    "attention2d does not serve the two together yet")


def _padded_attention(q, k, v, key_padding, groups, options):
    """attention() of a padded batch: the rows grouped by their padding (_padding_groups), each
    group one call with the padding as a document of its own (cu_seqlens [0, real, N] or
    [0, pads, N]), and the padded queries' outputs set to 0 (LSE -inf). Returns (out, lse) in
    flash-attn's order."""
    real = key_padding.detach().to("cpu").bool()
    batch, n, heads = q.shape[0], q.shape[1], q.shape[2]
    out = q.new_zeros(q.shape)
    lse = torch.full((batch, heads, n), float("-inf"), dtype=torch.float32, device=q.device)
    for bounds, rows in groups:
        index = torch.tensor(rows, dtype=torch.long, device=q.device)
        part_out, part_lse = attention(
            q.index_select(0, index), k.index_select(0, index), v.index_select(0, index),
            return_lse=True, cu_seqlens=None if bounds is None else list(bounds), **options)
        out = out.index_copy(0, index, part_out)
        lse = lse.index_copy(0, index, part_lse)
    keep = real.to(q.device)
    out = out * keep[:, :, None, None].to(out.dtype)
    lse = lse.masked_fill(~keep[:, None, :], float("-inf"))
    return out, lse


def _padded_backward(q, k, v, out, lse, d_out, key_padding, options):
    """dQ, dK, dV of _padded_attention from the caller's Q, K, V, its O and LSE and dO (the
    transformers op's backward, which saves only those): per group of rows, the group's engine
    and its backward, with dO 0 on padded queries (their O is 0, their LSE -inf: P = 0). None
    where no row is padded (the caller's usual backward then)."""
    chan = channel(options.get("comm"), options.get("group"), options.get("grid"))
    counts = chan.raise_collectively("", int(q.shape[1]), phase="key_padding")
    real = key_padding.detach().to("cpu").bool()
    groups = _padding_groups(real, chan, options.get("layout"), counts, sum(counts))
    if groups is None:
        return None
    d_out = d_out * real.to(d_out.device)[:, :, None, None].to(d_out.dtype)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for bounds, rows in groups:
        index = torch.tensor(rows, dtype=torch.long, device=q.device)
        part = [x.index_select(0, index) for x in (q, k, v, out, lse, d_out)]
        engine = attention(*part[:3], return_lse=True, _engine_only=True,
                           cu_seqlens=None if bounds is None else list(bounds), **options)
        dq_g, dk_g, dv_g, _ = _backward_in_user_layout(engine, *part)
        dq.index_copy_(0, index, dq_g)
        dk.index_copy_(0, index, dk_g)
        dv.index_copy_(0, index, dv_g)
    return dq, dk, dv
