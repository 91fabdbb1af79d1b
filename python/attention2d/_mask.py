"""attention2d.ranges(): MagiAttention's range masks for attention(mask=...).

A range mask is the union of slices [q0, q1) x [k0, k1) of global positions, each of a type
(MagiAttention's attn_type_map): 0 full, 1 causal (bottom-right aligned), 2 inv-causal (top-left
aligned), 3 bi-causal (both). Slices must not overlap. The library checks them (bounds, overlap)
with the sequence length, on every rank, before any data moves."""

from . import _core
from ._channel import Error, Keyed


def _pairs(ranges, name):
    """[[start, end], ...] from a list of pairs or a [n, 2] tensor / array."""
    values = ranges.tolist() if hasattr(ranges, "tolist") else ranges
    try:
        pairs = [(int(a), int(b)) for a, b in values]
    except (TypeError, ValueError):
        raise Error("%s must be [[start, end], ...] (a list of pairs or an [n, 2] tensor), got %r"
                    % (name, ranges)) from None
    return pairs


def _type_of(value):
    """A type from 0-3 or a name ("full", "causal", "inv-causal", "bi-causal")."""
    if isinstance(value, str):
        return _core.parse_range_type(value)
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise Error("unknown slice type %r: 0 full, 1 causal, 2 inv-causal, 3 bi-causal"
                    % (value,)) from None
    if number not in (0, 1, 2, 3):
        raise Error("unknown slice type %d: 0 full, 1 causal, 2 inv-causal, 3 bi-causal" % number)
    return number


class Ranges(Keyed):
    """A range mask for attention(mask=...): its slices (q0, q1, k0, k1, type), or a
    specification the library resolves against the sequence length ("prefix-lm:P",
    "block-causal:B", "chunked-causal:C", "random:S[:SEED]", or a file of slices, as a2d's --mask-ranges)."""

    def __init__(self, slices=None, spec=None):
        self._keep("ranges")
        self._slices = None if slices is None else tuple(slices)
        self.spec = spec

    def slices(self, seq):
        """The slices for a sequence of `seq` tokens, as (q0, q1, k0, k1, type) tuples."""
        if self._slices is not None:
            return list(self._slices)
        return [tuple(s) for s in _core.parse_mask_ranges(self.spec, int(seq))]

    def key(self):
        """What identifies the mask across ranks and calls."""
        return ("spec", self.spec) if self._slices is None else ("slices", self._slices)

    def __eq__(self, other):
        return isinstance(other, Ranges) and self.key() == other.key()

    def __hash__(self):
        return hash(self.key())

    def __repr__(self):
        if self._slices is None:
            return "ranges(%r)" % self.spec
        return "ranges(%d slices)" % len(self._slices)


def ranges(q_ranges, k_ranges=None, attn_type_map=None):
    """A range mask, as MagiAttention's flex_flash_attn_func takes it: q_ranges and k_ranges
    [[start, end], ...] (lists or [n, 2] tensors) and attn_type_map (n types: 0 full, 1 causal,
    2 inv-causal, 3 bi-causal, or their names; default all full). ranges("prefix-lm:1024"),
    ranges("block-causal:25%"), ranges("random:64"): a2d's generators."""
    if isinstance(q_ranges, str) and k_ranges is None and attn_type_map is None:
        return Ranges(spec=q_ranges)
    if k_ranges is None:
        raise Error("ranges() needs q_ranges and k_ranges (or a specification string)")
    q, k = _pairs(q_ranges, "q_ranges"), _pairs(k_ranges, "k_ranges")
    if len(q) != len(k):
        raise Error("q_ranges has %d ranges and k_ranges %d: one of each per slice"
                    % (len(q), len(k)))
    if attn_type_map is None:
        types = [0] * len(q)
    else:
        values = attn_type_map.tolist() if hasattr(attn_type_map, "tolist") else attn_type_map
        types = [_type_of(t) for t in values]
        if len(types) != len(q):
            raise Error("attn_type_map has %d types for %d slices" % (len(types), len(q)))
    return Ranges(slices=[(a, b, c, d, t) for (a, b), (c, d), t in zip(q, k, types)])
