"""Entries shaped like flash-attn's and ring-flash-attn's, so that their users change one import:
the same argument names and order, plus group= (a torch.distributed ProcessGroup) and layout=.

    flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                    alibi_slopes, deterministic, return_attn_probs, *, group, layout)
    flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs, block_table, *, group, layout)
    ring_flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, alibi_slopes,
                         deterministic, return_attn_probs, group)        # contiguous shards
    zigzag_ring_flash_attn_func(... the same ...)                        # zigzag shards

Each rank passes its shard of the sequence ([batch, local tokens, heads, head_dim]; varlen:
[local tokens, heads, head_dim] with the global cu_seqlens of the whole packed sequence) in
`layout` ("contiguous" by default, as ring_flash_attn_func shards; "zigzag" as
zigzag_ring_flash_attn_func does), and gets its shard of the output back in the same layout.
The attention itself is attention2d's (the planner's algorithm over all ranks of the group), exact
attention: dropout_p must be 0 and alibi_slopes None."""

from ._api import attention


def _unsupported(alibi_slopes, block_table=None):
    """The refusal of what attention2d does not compute ("" if nothing), raised by attention()
    on every rank together (a rank passing other arguments must not leave the others waiting)."""
    if alibi_slopes is not None:
        return "alibi_slopes: ALiBi biases are not supported by attention2d"
    if block_table is not None:
        return ("block_table (a paged KV cache) is not supported: use attention2d.Decoder for "
                "inference")
    return ""


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False, *, group=None, layout="contiguous", **options):
    """flash_attn.flash_attn_func over the ranks of `group`: q [batch, local tokens, heads,
    head_dim], k and v [batch, local tokens, kv_heads, head_dim]. Returns out, or (out,
    softmax_lse [batch, heads, local tokens], None) with return_attn_probs (attention
    probabilities are never formed). options: attention()'s others (algo, grid, threads, ...)."""
    return attention(q, k, v, causal=causal, softmax_scale=softmax_scale, window_size=window_size,
                     softcap=softcap, dropout_p=dropout_p, deterministic=deterministic,
                     return_attn_probs=return_attn_probs, group=group, layout=layout,
                     _refusal=_unsupported(alibi_slopes), **options)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None,
                           max_seqlen_k=None, dropout_p=0.0, softmax_scale=None, causal=False,
                           window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, *,
                           group=None, layout="contiguous", **options):
    """flash_attn.flash_attn_varlen_func over the ranks of `group`: q [local tokens, heads,
    head_dim] of the packed sequence, cu_seqlens_q = cu_seqlens_k the global document boundaries
    [0, l0, l0 + l1, ..., N] (self-attention: the same for queries and keys); max_seqlen_* are
    checked, not needed. Returns out [local tokens, heads, head_dim], or (out, softmax_lse
    [heads, local tokens], None)."""
    return attention(q, k, v, causal=causal, softmax_scale=softmax_scale, window_size=window_size,
                     softcap=softcap, dropout_p=dropout_p, deterministic=deterministic,
                     return_attn_probs=return_attn_probs, cu_seqlens=cu_seqlens_q, group=group,
                     layout=layout, _refusal=_unsupported(alibi_slopes, block_table),
                     _varlen=(cu_seqlens_k, max_seqlen_q, max_seqlen_k), **options)


def ring_flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                         window_size=(-1, -1), alibi_slopes=None, deterministic=False,
                         return_attn_probs=False, group=None):
    """ring_flash_attn.ring_flash_attn_func's arguments: contiguous shards (rank r holds the
    r-th slice of the sequence)."""
    return attention(q, k, v, causal=causal, softmax_scale=softmax_scale, window_size=window_size,
                     dropout_p=dropout_p, deterministic=deterministic,
                     return_attn_probs=return_attn_probs, group=group, layout="contiguous",
                     _refusal=_unsupported(alibi_slopes))


def zigzag_ring_flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                                window_size=(-1, -1), alibi_slopes=None, deterministic=False,
                                return_attn_probs=False, group=None):
    """ring_flash_attn.zigzag_ring_flash_attn_func's arguments: zigzag shards (rank r holds
    chunks r and 2P-1-r of 2P)."""
    return attention(q, k, v, causal=causal, softmax_scale=softmax_scale, window_size=window_size,
                     dropout_p=dropout_p, deterministic=deterministic,
                     return_attn_probs=return_attn_probs, group=group, layout="zigzag",
                     _refusal=_unsupported(alibi_slopes))
