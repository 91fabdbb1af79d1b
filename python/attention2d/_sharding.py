"""Layouts and shards: which global tokens each rank holds (Layout, layout()), cutting and
reassembling tensors (shard(), unshard()), and the caller's layout and positions as attention()
reads them."""

import numpy as np

from . import _core
from ._channel import Error, Keyed, channel, planner_grid, torch
from ._planning import USER_LAYOUTS, _problem, _resolve_plan, _window_size


def _layout_tokens(kind, seq, ranks, counts=None):
    """Every rank's global token indices (increasing) in a layout: contiguous (balanced, or the
    given counts), zigzag or cyclic."""
    if kind == "contiguous" and counts is not None:
        starts = np.concatenate([[0], np.cumsum(counts)])
        return [np.arange(starts[r], starts[r + 1], dtype=np.int64) for r in range(ranks)]
    return [np.asarray(t, dtype=np.int64) for t in _core.user_layout_tokens(kind, seq, ranks)]


class Layout(Keyed):
    """Which global tokens each rank's shards hold (in shard order): a plan's layout (from
    attention2d.layout(): .plan, .problem) or one of the layouts callers bring ("contiguous",
    "zigzag", "cyclic": .plan is None)."""

    def __init__(self, problem, chosen, ranks, rank, kind=None, tokens=None, slots=None):
        self._keep("layout")
        self.problem = problem
        self.plan = chosen
        self.ranks = ranks
        self.rank = rank
        self.kind = kind if kind is not None else chosen.layout
        # A plan's layout over a grid mesh: the engine's ranks in the caller's order
        # (Channel.slots), which the tokens below are indexed by.
        self.slots = slots
        if tokens is None:
            tokens = [np.asarray(t, dtype=np.int64)
                      for t in _core.layout_tokens(problem, chosen, ranks)]
            if slots:
                by_caller = [None] * ranks
                for engine_rank, part in enumerate(tokens):
                    by_caller[slots[engine_rank]] = part
                tokens = by_caller
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
    tokens on the group's ranks instead (no plan). Layout.tokens(r) is indexed by the caller's
    ranks (torch's, for a grid= DeviceMesh too)."""
    chan = channel(comm, group, grid)
    grid = planner_grid(grid)
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
    return Layout(problem, chosen, chan.size, chan.rank, slots=chan.slots)


def _as_layout(spec, seq, chan, counts=None):
    """A Layout from a Layout or a layout name, for `seq` tokens on the channel's ranks."""
    if isinstance(spec, Layout):
        return spec
    if spec not in USER_LAYOUTS:
        raise Error("layout=%r: choose one of %s, or a Layout from attention2d.layout()"
                    % (spec, ", ".join(repr(x) for x in USER_LAYOUTS)))
    return Layout(None, None, chan.size, chan.rank, spec,
                  _layout_tokens(spec, seq, chan.size, counts))


def shard(x, layout, dim=1, comm=None, group=None, grid=None):
    """This rank's shard of the full tensor x (torch or numpy; tokens along `dim`). layout: a
    Layout, or "contiguous" / "zigzag" / "cyclic" over the ranks of group= (or comm=, or a grid=
    DeviceMesh, in torch's order of its ranks). Without group= a layout name is cut over the
    DEFAULT group's ranks, not over the group the attention runs on: under data x sequence
    parallelism pass the sequence group here too (or a Layout made with group=), else the shards
    are cut for the wrong number of ranks (attention(positions=...) finds such a mismatch)."""
    lay = layout if isinstance(layout, Layout) else _as_layout(layout, x.shape[dim],
                                                               channel(comm, group, grid))
    index = lay.tokens()
    if x.shape[dim] != lay.seq:
        raise Error("shard: x has %d tokens along dim %d but the layout has %d"
                    % (x.shape[dim], dim, lay.seq))
    if torch is not None and isinstance(x, torch.Tensor):
        return x.index_select(dim, torch.from_numpy(index).to(x.device)).contiguous()
    return np.ascontiguousarray(np.take(x, index, axis=dim))


def unshard(x_local, layout, dim=1, comm=None, group=None, grid=None):
    """Collective: the full tensor from every rank's shard (on every rank). layout: a Layout, or
    "contiguous" (each rank's slice in rank order, any lengths) / "zigzag" / "cyclic"."""
    chan = channel(comm, group, grid)
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
