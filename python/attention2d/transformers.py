"""Hugging Face transformers models on attention2d: `attn_implementation="attention2d"`.

    import attention2d.transformers
    attention2d.transformers.register()                   # once, after init_process_group
    model = AutoModelForCausalLM.from_config(config, attn_implementation="attention2d")
    mine = attention2d.shard(torch.arange(N)[None], "contiguous")     # this rank's positions
    out = model(input_ids=ids[:, mine[0]], position_ids=mine, ...)

Every rank of the group passes its shard of `input_ids` (in `layout`, contiguous by default) with
`position_ids` holding the global positions of those tokens; each layer's attention then runs
over the whole sequence through attention2d and the model computes exactly what the unsharded
model computes. Causal self-attention with GQA, the models' sliding windows (Mistral, Qwen2/3,
Gemma 2/3's local layers, gpt-oss), `attn_logit_softcapping` (Gemma 2), attention sinks (gpt-oss's
learned per-head `s_aux` logits, trained through the engine's sinks), multi-head latent attention
(values of another head dim than the queries: DeepSeek V2/V3, MiniCPM3) and the models' scaling
are honoured; packed sequences are read from `position_ids` (each document's positions run 0, 1,
..., as transformers' DataCollatorWithFlattening makes them; the same documents in every row of
the batch), and a padded batch from `attention_mask` (each row padded at its end or its start,
with a length of its own: attention(key_padding=)). What cannot be served is refused in the
model's words, on every rank, before any of the attention's data moves: padding between a row's
tokens, padding beside packed documents or sinks, attention dropout in training, ALiBi, a
non-causal or cross-attention, a KV cache, 4-D or custom masks, flash-attention's
cu_seq_lens arguments, layers that mix the sequence outside the attention (Mamba, linear
attention, convolutions) or of a type attention2d does not know, decoders that number their
tokens themselves, and models that compute with the mask themselves. tests/python/
test_hf_models.py holds every model family of the installed transformers to this.

The attention is one torch.library custom op, `torch.ops.attention2d.hf_attention` (a fake
implementation for tracing, its backward another op, `hf_attention_backward`), so that
`torch.compile` of the model traces through it (docs/python.md, "torch.compile").
"""

import functools
from typing import Optional, Tuple

import torch

from . import _api
from ._channel import Error

__all__ = ["register", "NAME"]

NAME = "attention2d"
_configs = []  # handle -> dict(group=, layout=, options=)


class _Mask:
    """What attention2d's mask function hands the model in place of a mask: the 2-D padding mask
    (checked by the attention) and what transformers' mask function asked for beyond causality
    (a window of W tokens, chunks of C tokens), or the reason it cannot be served (the attention
    turns it into a refusal on every rank)."""

    def __init__(self, padding=None, window=0, chunk=0, reason="", model=None):
        self.padding = padding
        self.window = window
        self.chunk = chunk
        self.reason = reason
        self.model = model

    def _refuse(self, *_):
        """A model that computes with the mask itself (indexing it, adding it to its own scores,
        reading its dtype: DeepSeek's sparse-attention indexer, Doge's dynamic mask) would get no
        tensor: refused, on every rank (the same code reads it on every rank)."""
        raise Error(self.reason or (
            "the model (config.model_type=%r) computes with its attention mask itself (a dynamic "
            "or sparse mask of its own): attention2d hands the model no mask tensor (it masks "
            "causality, sliding windows, chunks and packed documents itself); use "
            "attn_implementation='eager' or 'sdpa'" % self.model))

    __getitem__ = __add__ = __radd__ = __mul__ = __rmul__ = __and__ = __rand__ = __or__ = \
        __ror__ = __invert__ = __neg__ = _refuse

    def __getattr__(self, name):  # a tensor's attributes and methods (shape, dtype, to, ...)
        if name.startswith("__"):
            raise AttributeError(name)
        self._refuse()


_MASKING = "transformers.masking_utils"
# transformers' mask functions attention2d knows (masking_utils; by __qualname__), and what each
# contributes to the intersection an and_masks() builds.
_KNOWN_PARTS = {
    "causal_mask_function": "causal",
    "sliding_window_overlay.<locals>.inner_mask": "window",
    "chunked_overlay.<locals>.inner_mask": "chunk",
    # packed sequences found in the local position_ids: attention2d reads the documents from the
    # global position_ids itself
    "packed_sequence_mask_function.<locals>.inner_mask": "documents",
    "padding_mask_function.<locals>.inner_mask": "padding",
}
# Those it does not serve, in words (anything else is named by its qualified name).
_UNSERVED_PARTS = {
    "or_masks.<locals>.or_mask": "a union of masks (an or_mask_function, or block_sequence_ids: "
                                 "blocks of image or audio tokens that see each other both ways)",
    "bidirectional_mask_function": "bidirectional attention",
    "sliding_window_bidirectional_overlay.<locals>.inner_mask": "a two-sided sliding window",
    "blockwise_overlay.<locals>.inner_mask": "blocks that see each other both ways "
                                             "(block_sequence_ids)",
}


# Layer types (config.layer_types, layers_block_type, block_types) whose layers mix tokens only
# through the attention interface, or not at all (nemotron_h's "moe" and "mlp" layers); any other
# type is refused, named.
_SERVED_LAYERS = {"full_attention", "sliding_attention", "chunked_attention", "attention", "moe",
                  "mlp"}
# Those known to mix the sequence outside the attention interface, in words.
_UNSERVED_LAYERS = {
    "linear_attention": "linear-attention or state-space (Mamba) layers",
    "mamba": "Mamba layers",
    "hybrid": "a state-space or convolutional mixer beside the attention",
    "conv": "short convolutions over the sequence",
    "recurrent": "recurrent (RG-LRU) blocks",
}
# Decoders that number their tokens 0, 1, ... themselves and never read position_ids (their
# learned or sinusoidal position embeddings take torch.arange of the local length): sharded,
# every rank would embed its tokens as the sequence's first. Found by tests/python/
# test_hf_models.py (transformers 5.17: the decoders of the encoder-decoder families).
_OWN_POSITIONS = {"bart", "bigbird_pegasus", "blenderbot", "blenderbot-small", "marian", "mbart",
                  "pegasus", "plbart"}


def _config_refusal(config):
    """What of the model's config attention2d cannot serve, in its words ("" if none): layers
    that mix the sequence outside the attention interface (Mamba, linear attention, convolutions:
    each would see only its rank's tokens) or of a type it does not know (an attention that
    selects or compresses its keys itself), and decoders that number their tokens themselves."""
    for name in ("layer_types", "layers_block_type", "block_types"):
        kinds = getattr(config, name, None)
        if not isinstance(kinds, (list, tuple)):
            continue
        unserved = [kind for kind in dict.fromkeys(kinds) if kind not in _SERVED_LAYERS]
        if unserved:
            return ("config.%s has %s: sharded, a layer that mixes the sequence outside the "
                    "attention interface sees only its rank's tokens, and attention2d cannot "
                    "know what a layer type it does not know attends to; it serves "
                    "full_attention, sliding_attention and chunked_attention layers (and layers "
                    "without attention); use attn_implementation='eager' or 'sdpa'" % (
                        name, ", ".join("%r (%s)" % (kind, _UNSERVED_LAYERS.get(
                            kind, "a layer type attention2d does not know"))
                            for kind in unserved)))
    if getattr(config, "model_type", None) in _OWN_POSITIONS:
        return ("config.model_type=%r: its decoder numbers its tokens 0, 1, ... itself (its "
                "position embeddings never read position_ids), so sharded every rank would embed "
                "its tokens as the sequence's first; use attn_implementation='eager' or 'sdpa'"
                % config.model_type)
    return ""


def _closure(fn):
    code = getattr(fn, "__code__", None)
    if code is None or not fn.__closure__:
        return {}
    return dict(zip(code.co_freevars, (cell.cell_contents for cell in fn.__closure__)))


def _mask_parts(fn):
    """transformers' mask function as a list of (part, value) whose intersection it is; raises
    ValueError naming a part attention2d does not serve."""
    name = getattr(fn, "__qualname__", type(fn).__name__)
    if getattr(fn, "__module__", None) != _MASKING:
        raise ValueError("a mask function of the model's own (%s.%s)"
                         % (getattr(fn, "__module__", "?"), name))
    if name == "and_masks.<locals>.and_mask":
        parts = []
        for part in _closure(fn).get("mask_functions", ()):
            parts += _mask_parts(part)
        return parts
    kind = _KNOWN_PARTS.get(name)
    if kind is None:
        raise ValueError(_UNSERVED_PARTS.get(name, "transformers' %s" % name))
    values = _closure(fn)
    value = {"window": lambda: int(values["sliding_window"]),
             "chunk": lambda: int(values["chunk_size"])}.get(kind, lambda: None)()
    return [(kind, value)]


def _mask_from_parts(mask_function):
    """(window, chunk, reason) from transformers' mask function's parts (its closures: eager
    only, as torch.compile's tracing cannot read closures)."""
    try:
        parts = _mask_parts(mask_function)
    except ValueError as e:
        return 0, 0, ("the model's mask combines its causal mask with %s: attention2d masks "
                      "causal attention, sliding windows, chunks and packed documents "
                      "(position_ids) only" % e)
    kinds = [kind for kind, _ in parts]
    windows = {value for kind, value in parts if kind == "window"}
    chunks = {value for kind, value in parts if kind == "chunk"}
    reason = ""
    if "causal" not in kinds:
        reason = ("the model's mask is not causal (%s): attention2d serves the causal "
                  "self-attention of decoder models" % ", ".join(kinds or ["no part"]))
    elif len(windows) > 1 or len(chunks) > 1 or (windows and chunks):
        reason = ("the model's mask intersects windows %s and chunks %s: attention2d masks one "
                  "window or one chunk size" % (sorted(windows), sorted(chunks)))
    return (windows.pop() if len(windows) == 1 else 0,
            chunks.pop() if len(chunks) == 1 else 0, reason)


def _mask_from_names(mask_function, local_size, config, use_vmap):
    """(window, chunk, reason) from what torch.compile can trace: the name of transformers' mask
    function (its code object), the size transformers hands the mask interface (local_size: the
    window of create_sliding_window_causal_mask, the chunk of create_chunked_causal_mask) and
    the config it took it from. _mask_function holds it to the parts' reading in eager runs, and
    test_transformers.py to it for every model family of the installed transformers."""
    code = getattr(mask_function, "__code__", None)
    name = code.co_qualname if code is not None else type(mask_function).__name__
    if code is None or not code.co_filename.endswith("masking_utils.py"):
        return 0, 0, ("the model's mask is a mask function of its own (%s): attention2d masks "
                      "causal attention, sliding windows, chunks and packed documents "
                      "(position_ids) only" % name)
    if use_vmap:  # transformers' sign of an or_mask_function / and_mask_function
        return 0, 0, ("the model combines its causal mask with an or_mask_function / "
                      "and_mask_function (bidirectional image tokens, a custom mask): attention2d "
                      "masks causal attention, sliding windows, chunks and packed documents "
                      "(position_ids) only")
    if name == "causal_mask_function" and local_size is None:
        return 0, 0, ""
    if name == "and_masks.<locals>.and_mask":  # causal, with a window, chunks or documents
        if local_size is None:
            return 0, 0, ""
        window = int(local_size) == getattr(config, "sliding_window", None)
        chunk = int(local_size) == getattr(config, "attention_chunk_size", None)
        if window != chunk:
            return (int(local_size), 0, "") if window else (0, int(local_size), "")
    return 0, 0, ("the model's mask is transformers' %s with local_size=%s: attention2d masks "
                  "causal attention, sliding windows, chunks and packed documents "
                  "(position_ids) only" % (_UNSERVED_PARTS.get(name, name), local_size))


def _mask_function(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                   attention_mask=None, use_vmap=False, **kwargs):
    """transformers' mask interface: attention2d masks causality, the window, the chunks and the
    documents itself, so the model gets back a _Mask: the 2-D padding mask (checked by the
    attention), the window and chunk size read from transformers' mask function (which is all
    some models say of their windows: Qwen2-MoE, PhiMoE), or a refusal for what cannot be
    expressed. Under torch.compile the function's name and local_size are read
    (_mask_from_names); in eager runs also its parts, and the two readings must agree."""
    if not isinstance(q_offset, int) or q_offset or kv_offset or kv_length != q_length:
        return _Mask(reason="a KV cache (past_key_values, use_cache=True): attention2d computes "
                            "self-attention of the sharded sequence; pass use_cache=False "
                            "(attention2d.Decoder serves inference)")
    config = kwargs.get("config")
    window, chunk, reason = _mask_from_names(mask_function, kwargs.get("local_size"), config,
                                             use_vmap)
    if not torch.compiler.is_compiling():
        exact = _mask_from_parts(mask_function)
        if exact[2]:
            reason = exact[2]
        elif (window, chunk, bool(reason)) != exact[:2] + (False,):
            reason = ("attention2d reads the model's mask function as window %d, chunk %d from "
                      "its parts, but as %s from its name and local_size (what torch.compile "
                      "can trace): refused rather than guessed"
                      % (exact[0], exact[1], reason or "window %d, chunk %d" % (window, chunk)))
    return _Mask(attention_mask, window, chunk, reason or _config_refusal(config),
                 getattr(config, "model_type", None))


def _refusal(module, query, key, attention_mask, dropout, kwargs):
    """The model's setting that attention2d cannot serve, in the model's words ("" if none):
    decided from shapes and the configuration (no tensor data), so that it also traces."""
    config = getattr(module, "config", None)
    model = type(module).__name__
    if not getattr(module, "is_causal", True):  # before the mask: the model's own setting
        return ("%s.is_causal is False (%s): attention2d serves the causal self-attention of "
                "decoder models" % (model, "config.use_bidirectional_attention=True"
                                    if getattr(config, "use_bidirectional_attention", False)
                                    else "an encoder's or a cross-attention"))
    if isinstance(attention_mask, _Mask) and attention_mask.reason:
        return attention_mask.reason
    unserved = _config_refusal(config)
    if unserved:
        return unserved
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() != 2:
        return ("a %d-D attention_mask reached %s (a prepared or custom mask): attention2d masks "
                "causal attention, sliding windows and packed documents itself; pass no "
                "attention_mask (packed documents: position_ids restarting at 0)"
                % (attention_mask.dim(), model))
    if getattr(module, "attn_temperature_tuning", False) and not getattr(module, "use_rope", True):
        return ("%s scales the queries of its NoPE layers by positions it counts from 0 on each "
                "rank (config.attn_temperature_tuning), not by the tokens' global positions: "
                "sharded, every rank would scale its own tokens as the sequence's first. Set "
                "config.attn_temperature_tuning=False (a different model), or use "
                "attn_implementation='eager' or 'sdpa'" % model)
    if config is not None and (getattr(config, "alibi", False)
                               or getattr(config, "position_embedding_type", "") == "alibi"):
        return ("%s uses ALiBi (config.alibi / position_embedding_type='alibi'): attention2d "
                "adds no ALiBi biases; use attn_implementation='eager' or 'sdpa'" % model)
    if query.shape[2] != key.shape[2]:
        return ("%s attends %d query tokens to %d keys (cross-attention or a KV cache): "
                "attention2d computes self-attention of the sharded sequence; pass "
                "use_cache=False" % (model, query.shape[2], key.shape[2]))
    if dropout:
        return ("config.attention_dropout=%s and the model is training: attention2d computes "
                "exact attention without dropout; set config.attention_dropout=0.0 (or call "
                "model.eval())" % dropout)
    for name in ("cu_seq_lens_q", "cu_seq_lens_k"):
        if kwargs.get(name) is not None:
            return ("%s was passed (flash-attention's packed-batch arguments): attention2d reads "
                    "the documents from the global position_ids; drop it (DataCollatorWithFlattening"
                    "(return_flash_attn_kwargs=False))" % name)
    sinks = kwargs.get("s_aux")
    if sinks is not None and (not isinstance(sinks, torch.Tensor)
                              or tuple(sinks.shape) != (query.shape[1],)):
        return ("%s passes attention sinks (s_aux) of shape %s: attention2d serves one learned "
                "logit per query head (gpt-oss), shape [%d]"
                % (model, list(getattr(sinks, "shape", [])), query.shape[1]))
    return ""


def _missing_positions(model):
    """The refusal of a call whose attention was handed no position_ids."""
    if model.startswith("Llama4"):
        return ("%s is not handed position_ids: Llama 4's decoder layers keep them, and its NoPE "
                "layers scale their queries by positions counted from 0 on each rank "
                "(config.attn_temperature_tuning), so attention2d can neither check the global "
                "positions of a rank's tokens nor give the unsharded model's result; use "
                "attn_implementation='eager' or 'sdpa'" % model)
    return _local_refusal(None, None, None, model)


def _local_refusal(q, position_ids, padding, model="the attention"):
    """Refusals that need the tensors' values (run inside the op, not traced). Padding in
    attention_mask is served (attention(key_padding=): rows padded at their end or start);
    what attention() refuses of it, it refuses on every rank."""
    if position_ids is None:
        return ("position_ids did not reach %s: pass the model position_ids with the global "
                "positions of this rank's tokens (attention2d.shard(torch.arange(N)[None], "
                "layout)), else every rank's tokens would be taken for positions 0..n-1 (a model "
                "that keeps position_ids from its attention layers cannot be checked, and is "
                "not served)" % model)
    if position_ids.dim() != 2 or position_ids.shape[-1] != q.shape[1]:
        return ("position_ids has shape %s for %d local tokens: pass [batch or 1, local tokens]"
                % (list(position_ids.shape), q.shape[1]))
    if position_ids.shape[0] > 1 and not bool((position_ids == position_ids[:1]).all()):
        return ("position_ids differ between the batch's rows: attention2d packs the same "
                "documents in every row; put each packing in its own batch (batch size 1)")
    return ""


def _call(q, k, v, sinks, position_ids, padding, handle, scale, window, chunk, softcap, refusal,
          engine_only):
    """attention() of the op: causal with a window of `window` tokens (0: none), or with chunks
    of `chunk` tokens (causal within each, none across: the range mask chunked-causal:C)."""
    config = _configs[handle]
    refusal = refusal or _local_refusal(q, position_ids, padding)
    positions = None if refusal else position_ids[0]
    mask = {"causal": True, "window": window} if not chunk else {
        "mask": "chunked-causal:%d" % chunk}
    # attention_mask (the 2-D padding mask, this rank's shard) is the key padding: the rows
    # padded on any rank are masked per row (documents and padding are not served together).
    with torch.no_grad():
        return _api.attention(q, k, v, softmax_scale=scale, softcap=softcap, sinks=sinks,
                              group=config["group"], layout=config["layout"], return_lse=True,
                              positions=positions, qkv_format="bshd", _documents=True,
                              key_padding=None if refusal else padding, _refusal=refusal,
                              _engine_only=engine_only, **mask, **config["options"])


@torch.library.custom_op("attention2d::hf_attention", mutates_args=())
def hf_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: Optional[torch.Tensor],
                 position_ids: Optional[torch.Tensor], padding: Optional[torch.Tensor],
                 handle: int, scale: Optional[float], window: int, chunk: int, softcap: float,
                 refusal: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """This rank's attention output [batch, local tokens, heads, head_dim] and fp32 LSE [batch,
    heads, local tokens] of q [batch, local tokens, heads, head_dim] and k, v (kv_heads), with
    sinks (a logit per query head joining each row's softmax denominator, gpt-oss's s_aux) or
    None; causal with a window (0: none) or with chunks (0: none); collective over the
    registered group."""
    out, lse = _call(q, k, v, sinks, position_ids, padding, handle, scale, window, chunk, softcap,
                     refusal, False)
    return out, lse


@hf_attention.register_fake
def _(q, k, v, sinks, position_ids, padding, handle, scale, window, chunk, softcap, refusal):
    b, n, h, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((b, h, n), dtype=torch.float32)


@torch.library.custom_op("attention2d::hf_attention_backward", mutates_args=())
def hf_attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                          lse: torch.Tensor, d_out: torch.Tensor, sinks: Optional[torch.Tensor],
                          position_ids: Optional[torch.Tensor], padding: Optional[torch.Tensor],
                          handle: int, scale: Optional[float], window: int, chunk: int,
                          softcap: float
                          ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV and dsinks (empty without sinks) of hf_attention (collective). The same
    engine as the forward (the engine cache keeps it); with a layout exchange, Q, K, V, O, LSE
    and dO go into the plan's layout again (the op saves only the caller's tensors). dsinks is
    this rank's 1/P of the sum over all ranks' rows, so that summing the ranks' gradients, as
    for every replicated parameter of a sequence-sharded model, gives the sinks' gradient. A
    padded batch: per group of rows of one padding (_api._padded_backward)."""
    if padding is not None:
        config = _configs[handle]
        grads = _api._padded_backward(
            q, k, v, out, lse, d_out, padding,
            dict(causal=True, window=window, softmax_scale=scale, softcap=softcap,
                 group=config["group"], layout=config["layout"], positions=position_ids[0],
                 qkv_format="bshd", **config["options"]))
        if grads is not None:
            return grads + (q.new_empty(0),)
    engine = _call(q, k, v, sinks, position_ids, None, handle, scale, window, chunk, softcap, "",
                   True)
    dq, dk, dv, dsinks = _api._backward_in_user_layout(engine, q, k, v, out, lse, d_out, sinks)
    return dq, dk, dv, q.new_empty(0) if dsinks is None else dsinks


@hf_attention_backward.register_fake
def _(q, k, v, out, lse, d_out, sinks, position_ids, padding, handle, scale, window, chunk,
      softcap):
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            q.new_empty(0) if sinks is None else sinks.new_empty(sinks.shape))


def _setup_context(ctx, inputs, output):
    q, k, v, sinks, position_ids, padding, handle, scale, window, chunk, softcap, _ = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, sinks, position_ids, padding)
    ctx.arguments = (handle, scale, window, chunk, softcap)


def _backward(ctx, d_out, d_lse):
    q, k, v, out, lse, sinks, position_ids, padding = ctx.saved_tensors
    dq, dk, dv, dsinks = hf_attention_backward(q, k, v, out, lse, d_out, sinks, position_ids,
                                               padding, *ctx.arguments)
    return (dq, dk, dv, None if sinks is None else dsinks, None, None, None, None, None, None,
            None, None)


hf_attention.register_autograd(_backward, setup_context=_setup_context)


def _attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
               sliding_window=None, softcap=None, *, handle, **kwargs):
    """transformers' attention interface: query [batch, heads, local tokens, head_dim], key and
    value [batch, kv_heads, local tokens, head_dim]; returns (out [batch, local tokens, heads,
    head_dim], None)."""
    refusal = _refusal(module, query, key, attention_mask, dropout, kwargs)
    if kwargs.get("output_attentions"):
        refusal = refusal or ("output_attentions=True: attention2d never forms the attention "
                              "probabilities; use attn_implementation='eager' to inspect them")
    if kwargs.get("position_ids") is None:
        refusal = refusal or _missing_positions(type(module).__name__)
    window, chunk = int(sliding_window or 0), 0
    padding = attention_mask
    if isinstance(attention_mask, _Mask):
        # The mask is what eager and SDPA attend with; a window the model also hands the
        # attention (flash-attention's argument) must be the same.
        padding, chunk = attention_mask.padding, attention_mask.chunk
        if window and attention_mask.window != window:
            refusal = refusal or (
                "%s hands the attention sliding_window=%d but its mask has %s: attention2d "
                "cannot know which one the model means" % (
                    type(module).__name__, window, "a window of %d" % attention_mask.window
                    if attention_mask.window else "no window"))
        window = attention_mask.window
    if not (isinstance(padding, torch.Tensor) and padding.dim() == 2):
        padding = None
    sinks = kwargs.get("s_aux") if not refusal else None
    # Multi-head latent attention (DeepSeek V2/V3, Kimi K2, MiniCPM3...) has values of another head
    # dim than the queries and keys (v_head_dim 128, qk_head_dim 192): the engine takes one head
    # dim, so the narrower side is padded with zeros (zero query/key columns add nothing to the
    # scores, zero value columns give zero output columns, cut off again) and the scale kept
    # the model's (1/sqrt of the query's head dim by default), as transformers' flash-attention
    # path pads the values.
    head_dim, value_dim = query.shape[-1], value.shape[-1]
    if value_dim != head_dim and key.shape[-1] == head_dim and not refusal:
        scaling = head_dim ** -0.5 if scaling is None else scaling
        width = max(head_dim, value_dim)
        query, key, value = (torch.nn.functional.pad(x, (0, width - x.shape[-1]))
                             for x in (query, key, value))
    out, _ = hf_attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                          sinks, kwargs.get("position_ids"), padding, handle,
                          None if scaling is None else float(scaling), window, chunk,
                          float(softcap or 0.0), refusal)
    return out[..., :value_dim], None


def register(group=None, layout="contiguous", name=NAME, **options):
    """Registers attention2d with transformers' AttentionInterface and AttentionMaskInterface as
    `name`: models built or loaded with attn_implementation=name then run their attention over
    the ranks of `group` (a ProcessGroup or DeviceMesh; default: torch.distributed's default
    group), each rank holding its shard of the sequence in `layout` ("contiguous", "zigzag",
    "cyclic" or an attention2d.Layout) and passing position_ids with its tokens' global positions.
    options: attention()'s others (algo, grid, threads, heads_parallel). Registering the same
    name again replaces the earlier registration. Returns name."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as e:
        raise Error("attention2d.transformers needs Hugging Face transformers (pip install "
                    "transformers): %s" % e) from None
    if not isinstance(layout, _api.Layout) and layout not in _api.USER_LAYOUTS:
        raise Error("layout=%r: choose one of %s, or a Layout from attention2d.layout()"
                    % (layout, ", ".join(repr(x) for x in _api.USER_LAYOUTS)))
    unknown = set(options) - {"algo", "grid", "threads", "heads_parallel", "machine",
                              "calibration"}
    if unknown:
        raise Error("register(): unknown option %s (attention()'s algo, grid, threads, "
                    "heads_parallel)" % ", ".join(sorted(unknown)))
    handle = len(_configs)
    _configs.append({"group": group, "layout": layout, "options": dict(options)})
    AttentionInterface.register(name, functools.partial(_attention, handle=handle))
    AttentionMaskInterface.register(name, _mask_function)
    return name
