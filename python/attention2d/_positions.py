"""The caller's positions (attention(positions=...), and transformers' position_ids) read in
O(N/P) per rank and sent only when they change.

Each rank reads its own positions against its own tokens of the caller's layout (numpy, no Python
loop over tokens) and sends a summary of a size set by the documents it holds, not by its tokens:
  check       (positions=): whether its positions are its tokens of layout= (one flag);
  documents   (transformers' position_ids, restarting at 0 in each packed document): the global
              indices where a document starts on it, and for each run of its tokens that claims
              one document start d (token g at position g - d), that start and the run's last
              token.
Every rank then checks the summaries together (the same verdict everywhere): each claimed start is
a document start and no other start lies between it and its run's end. That is exactly "each
document's positions run 0, 1, 2, ... in the global order".

A rank whose positions equal those of the last exchange on the channel (compared in full with a
copy kept of them) says so in the call's argument exchange, and when every rank says so nothing
more is sent: the result of the last exchange stands (the backward, the next layer). A refusal runs the exchange of every rank's positions once more, to name the first
token that is wrong."""

import numpy as np

from . import _core
from ._channel import Error, torch


def _as_array(positions):
    """A 1-D int64 numpy array of the positions (a view of a CPU torch tensor's memory); a
    ValueError for values that are not integers (never truncated)."""
    if torch is not None and isinstance(positions, torch.Tensor):
        positions = positions.detach()
        if positions.dtype.is_floating_point or positions.dtype.is_complex:
            raise ValueError(str(positions.dtype))
        if positions.device.type != "cpu":
            positions = positions.cpu()
        return positions.to(torch.int64).reshape(-1).numpy()
    values = np.asarray(positions)
    if values.size and not np.issubdtype(values.dtype, np.integer):
        raise ValueError(str(values.dtype))
    return values.astype(np.int64, copy=False).reshape(-1)


def read_positions(positions, tokens_and_heads, sdpa_hint=""):
    """This rank's positions as an array, or an error text (before any data moves).
    tokens_and_heads: q's local tokens and heads as its shape reads them; `sdpa_hint` (a
    tensor-order hint, or "") joins the error where there are as many positions as q has heads:
    the tokens of tensors in SDPA's order."""
    try:
        mine = _as_array(positions)
    except (TypeError, ValueError, RuntimeError):
        return None, ("positions must be a 1-D list or tensor of this rank's global token indices "
                      "(integers)")
    tokens, heads = tokens_and_heads
    if len(mine) != tokens:
        return None, ("positions has %d entries for %d local tokens (one global index per token "
                      "of this rank's shard, in shard order)%s"
                      % (len(mine), tokens, sdpa_hint if len(mine) == heads else ""))
    return mine, ""


def unchanged(chan, mode, mine):
    """Whether this rank's positions (an array, or None) equal those it sent at the channel's
    last exchange of `mode` (compared in full, a memcmp's O(N/P): a write that torch's version
    counter does not see, through .numpy() or .data, is seen here): its flag in the call's
    argument exchange."""
    memo = chan.positions_memo.get(mode)
    return (memo is not None and mine is not None and len(mine) == len(memo["positions"])
            and bool(np.array_equal(mine, memo["positions"])))


def _runs_of(tokens):
    """Increasing token indices as runs (first, stride, count) of constant stride, in order
    (greedy: each run as long as its stride holds; a lone last token is a run of its own)."""
    n = len(tokens)
    steps = np.diff(tokens)
    changes = np.flatnonzero(steps[1:] != steps[:-1]) + 1  # steps[j] != steps[j - 1]
    runs, begin = [], 0
    while begin < n:
        if begin == n - 1:
            runs.append((int(tokens[begin]), 1, 1))
            break
        at = np.searchsorted(changes, begin, side="right")
        end = int(changes[at]) if at < len(changes) else n - 1  # the run's last token
        runs.append((int(tokens[begin]), int(steps[begin]), end - begin + 1))
        begin = end + 1
    return runs


def own_runs(layout, shards, counts, seq, rank, ranks):
    """This rank's global tokens in the caller's layout, as runs (first, stride, count) in shard
    order: O(1) for a layout name (the engine's layout: _core.caller_runs), read once from the
    tokens of a Layout object (kept on it)."""
    from ._sharding import Layout

    if isinstance(layout, Layout):
        cache = layout.__dict__.setdefault("_runs", {})
        if rank not in cache:
            cache[rank] = _runs_of(np.asarray(layout.tokens(rank), dtype=np.int64))
        return cache[rank]
    if shards[0] == "plan":  # one rank
        return [(0, 1, seq)] if seq else []
    return _core.caller_runs(shards[0], list(shards[1]), seq, ranks, rank)


def _summary(mode, mine, runs):
    """This rank's summary of its positions (the module's docstring), from its tokens' runs:
    token i of a run is first + i * stride, so within a run the document a token claims
    (token - position) changes exactly where the positions do not step by the stride."""
    if mode == "check":
        at = 0
        for first, stride, count in runs:
            part = mine[at:at + count]
            if part[0] != first or (count > 1 and not (np.diff(part) == stride).all()):
                return False
            at += count
        return True
    empty = np.empty(0, np.int64)
    if len(mine) == 0:
        return (empty, empty, empty, False, False)
    starts, claims, reaches, at = [], [], [], 0
    for first, stride, count in runs:
        part = mine[at:at + count]
        starts.append(first + stride * np.flatnonzero(part == 0))
        cut = np.flatnonzero(np.diff(part) != stride) + 1
        heads = np.concatenate([[0], cut])
        tails = np.concatenate([cut, [count]]) - 1
        claims.append(first + stride * heads - part[heads])
        reaches.append(first + stride * tails)
        at += count
    n = len(mine)
    local_default = bool(mine[0] == 0 and mine[-1] == n - 1 and
                         np.array_equal(mine, np.arange(n)))
    return (np.concatenate(starts), np.concatenate(claims), np.concatenate(reaches),
            local_default, bool((mine < 0).any()))


def _documents_verdict(summaries, seq, ranks):
    """The document bounds (None for one document) from every rank's summary, or None and False
    where the positions are not documents' positions in the global order."""
    if ranks > 1 and all(s[3] for s in summaries):
        return None, False  # 0..n-1 on every rank: refused with its own message
    if any(s[4] for s in summaries):
        return None, False  # a negative position
    if seq == 0:
        return None, True
    starts = np.sort(np.concatenate([s[0] for s in summaries]))
    claims = np.concatenate([s[1] for s in summaries])
    reach = np.concatenate([s[2] for s in summaries])
    if len(starts) == 0 or starts[0] != 0:
        return None, False
    at = np.searchsorted(starts, claims)
    inside = at < len(starts)
    if not inside.all() or not (starts[np.minimum(at, len(starts) - 1)] == claims).all():
        return None, False
    following = at + 1
    bounded = following < len(starts)
    if (starts[following[bounded]] <= reach[bounded]).any():
        return None, False
    if len(starts) == 1:
        return None, True
    return tuple(int(x) for x in starts) + (int(seq),), True


def resolve(chan, mode, mine, flags, layout, shards, counts, seq, slow):
    """Collective, after the argument exchange (`flags`: every rank's unchanged() flag): the
    documents' bounds (mode "documents") or nothing (mode "check"); refused on every rank where
    the positions do not fit. `slow(all_positions)` raises the precise refusal from every rank's
    positions (which it then exchanges)."""
    memos = chan.positions_memo
    key = (repr(shards), tuple(counts), int(seq), _layout_key(layout))
    memo = memos.get(mode)
    if memo is not None and memo["key"] == key and all(flags):
        return memo["result"]
    memos.pop(mode, None)
    ranks = chan.size
    runs = own_runs(layout, shards, counts, seq, chan.rank, ranks)
    summaries = chan.allgather(_summary(mode, mine, runs), "attention() positions")
    if mode == "check":
        ok, result = all(summaries), None
    else:
        result, ok = _documents_verdict(summaries, seq, ranks)
    if not ok:
        everyone = chan.allgather(mine, "attention() positions")
        slow([positions.tolist() for positions in everyone])  # Python ints, for its message
        raise Error("internal: the positions were refused without a message")
    memos[mode] = {"key": key, "result": result, "positions": mine.copy()}
    return result


def _layout_key(layout):
    """What decides the tokens of a layout= (a Layout by its contents, not its identity)."""
    from ._sharding import Layout

    if not isinstance(layout, Layout):
        return layout
    return ("layout", layout.kind, tuple(layout.counts()),
            None if layout.plan is None else layout.plan.describe(), tuple(layout.slots or ()))
