"""Every model family of the installed transformers whose causal LM calls the attention interface
(issue 57): each built tiny from its config class (random weights, nothing from a hub) with its
window and chunk options on, run with attn_implementation="attention2d" on contiguous shards
(global position_ids, SEQ = 29 tokens, batch 2) against the one-process eager model on the whole
sequence, forward and backward once (the loss: the logits' sum weighted by fixed random numbers,
so any model's logits serve, no labels): the logits and every parameter's gradient (summed over
the ranks) within 1e-5 relative (fp32), or the same attention2d.Error on every rank. A family
that gives another answer without a refusal, or raises another error where eager runs, fails
the test: the next transformers release cannot add a silent path.

The families are read from the installed package (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES whose
modeling file calls ALL_ATTENTION_FUNCTIONS); their configs are shrunk by their fields' names
(SIZES, PATTERNS: hidden 32, 2 layers or one of each layer type, 4 heads, 2 K/V heads, vocabulary
61, 64 positions, windows of 7, chunks of 8), with per-family fix-ups (FIXES) only where a tiny
config needs one; EXCLUDED says why a family is not built, and a family whose tiny model does not
build or run under eager is skipped with the error. Two allowances, both for rounding: a
gradient below 1e-4 of the whole model's gradient norm is measured against that floor (the key
biases' gradients are 0 in exact arithmetic), and where attention2d is further than 1e-5 from
fp32 eager, both are measured against the fp64 eager model and attention2d must be within 2x
fp32 eager's own error (Gemma 4's unscaled scores: fp32 eager itself is 1.5e-5 from fp64).
The mask readings are held to agree for every family: transformers' mask function read from
its parts (eager) and from its name and local_size (what torch.compile traces).

Under scripts/launch/launch.py at P = 2 (CTest python.torch.hf_models.np2); the table is
printed on rank 0 (also without -s). A2D_HF_FAMILIES=llama,gemma2 runs a subset."""

import dataclasses
import os
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import attention2d  # noqa: E402
from conftest import COMM, TORCH_LAUNCH, relative_error  # noqa: E402

transformers = pytest.importorskip("transformers")
import attention2d.transformers as hf  # noqa: E402
from transformers.models.auto import configuration_auto, modeling_auto  # noqa: E402

P, RANK = COMM.Get_size(), COMM.Get_rank()
FP32 = 1e-5
RATIO = 2.0  # where fp32 eager itself is further than FP32 from fp64 eager
GRADIENT_FLOOR = 1e-4
SEQ = 29  # odd; longer than the windows (7) and chunks (8)
VOCAB = 61
ROWS = 2
MAX_PARAMETERS = 600_000  # a config the shrinker did not make tiny is skipped, not built
pytestmark = pytest.mark.skipif(not TORCH_LAUNCH and P > 1,
                                reason="needs the torch.distributed launch")

# The common size attributes of transformers' configs and their tiny values.
SIZES = {
    ("vocab_size",): VOCAB,
    ("hidden_size", "d_model", "n_embd", "n_embed", "dim", "hidden_dim"): 32,
    ("intermediate_size", "ffn_dim", "decoder_ffn_dim", "encoder_ffn_dim", "n_inner", "dff",
     "ffn_hidden_size", "intermediate_size_mlp", "dense_intermediate_size"): 48,
    ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "decoder_layers",
     "encoder_layers"): 2,
    ("num_attention_heads", "n_head", "n_heads", "num_heads", "decoder_attention_heads",
     "encoder_attention_heads"): 4,
    ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num"): 2,
    ("head_dim",): 8,
    ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len",
     "max_target_positions", "max_source_positions"): 64,
    ("num_experts", "num_local_experts", "n_routed_experts"): 4,
    ("num_experts_per_tok", "moe_topk"): 2,
    ("n_shared_experts",): 1,
    ("n_group", "topk_group"): 1,  # DeepSeek's expert groups (8 of 4 experts: none)
    ("first_k_dense_replace", "num_dense_layers"): 1,  # layer 0 dense, layer 1 a mixture
    ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"): 8,
    ("n_groups", "mamba_n_groups", "mamba_ngroups"): 1,
    ("is_decoder",): True,  # the encoders' causal-LM heads (BertLMHeadModel...) as decoders
    # the families' windows and chunks, on
    ("sliding_window", "sliding_window_size", "attention_window_size", "keep_window_size"): 7,
    ("local_attention",): 14,  # ModernBERT-decoder: a window of local_attention // 2
    ("attention_chunk_size",): 8,
    ("use_sliding_window",): True,
    ("max_window_layers",): 1,
    ("use_cache",): False,
}
SIZE = {name: value for names, value in SIZES.items() for name in names}
# The other int fields above 64, by what their names contain (the first match; else 16).
PATTERNS = (("vocab_size", VOCAB), ("key_value_heads", 2), ("kv_heads", 2), ("kv_n_heads", 2),
            ("heads", 4), ("head_dim", 8), ("lora_rank", 16), ("moe", 16), ("expert", 16),
            ("shared", 16), ("intermediate", 48), ("ffn", 48), ("hidden_size", 32),
            ("embed_dim", 16), ("d_state", 8), ("state_size", 8), ("chunk_size", 8),
            ("d_ssm", 64))
KEEP = ("theta", "base", "seed", "scale", "factor", "multiplier", "token")

# Per-family fix-ups of the tiny config (by the config's model_type), where the generic shrinker
# cannot know a constraint.
FIXES = {
    # one layer of each kind, where the tiny config's own rule makes none of one kind: a
    # hybrid's attention layer (Jamba, Bamba, Granite-MoE-hybrid, RecurrentGemma) or the short
    # convolutions of LFM2
    "jamba": dict(attn_layer_period=2, attn_layer_offset=1),
    "bamba": dict(attn_layer_indices=[1]),
    "granitemoehybrid": dict(layer_types=["mamba", "attention"]),
    "recurrent_gemma": dict(block_types=["recurrent", "attention"]),
    "lfm2": dict(layer_types=["conv", "full_attention"]),
    "lfm2_moe": dict(layer_types=["conv", "full_attention"]),  # (none by default)
    # Zamba ties one shared transformer block into every hybrid layer: two of them
    "zamba": dict(num_hidden_layers=3, layers_block_type=["linear_attention", "hybrid",
                                                          "hybrid"]),
    "zamba2": dict(layers_block_type=["mamba", "hybrid"]),
    # the last num_kv_shared_layers layers reuse the keys and values of earlier ones
    "gemma3n_text": dict(num_hidden_layers=4, num_kv_shared_layers=2,
                         layer_types=["sliding_attention", "full_attention"] * 2,
                         activation_sparsity_pattern=[0.95, 0.0, 0.0, 0.0]),
    # rope parameters per layer type (3-D rope sections: head_dim 16)
    "cohere_compass_text": dict(
        hidden_size=64, layer_types=["sliding_attention", "full_attention"],
        rope_parameters={kind: {"rope_type": "default", "rope_theta": 10000.0,
                                "mrope_section": [3, 3, 2]}
                         for kind in ("sliding_attention", "full_attention")}),
    # the sparse attention's indexer (none by default)
    "qwen4_exp_text": dict(indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=8,
                           indexer_budget=8, indexer_compress_ratio=2),
    "zaya": dict(num_experts_per_tok=1),  # ("ZAYA currently supports num_experts_per_tok=1")
    # (transformers 5.17's DbrxAttention reads attn_config.rope_theta, which the config does not
    # define, and clamps by clip_qkv, None by default: both set)
    "dbrx": dict(attn_config=dict(kv_n_heads=2, rope_theta=10000.0, clip_qkv=8.0),
                 ffn_config=dict(ffn_hidden_size=48, moe_num_experts=4, moe_top_k=2)),
}
# Families not built, with the reason.
EXCLUDED = {
    "musicgen": "a decoder of audio codebooks ([batch * codebooks, tokens] input_ids), built "
                "with a text encoder and an audio encoder of other model types",
    "musicgen_melody": "as musicgen",
    "blt": "byte latent transformer: local byte encoders and decoders cross-attending to "
           "patches of an entropy model (a hash embedding of 500002 rows x 2 per layer)",
}


def families():
    """[(family, config class)] of the causal LMs whose modeling file calls transformers'
    attention interface (ALL_ATTENTION_FUNCTIONS), from the installed package."""
    found = []
    root = os.path.dirname(transformers.models.__file__)
    for family in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        module = configuration_auto.model_type_to_module_name(family)
        path = os.path.join(root, module, "modeling_%s.py" % module)
        if os.path.exists(path):
            with open(path) as f:
                if "ALL_ATTENTION_FUNCTIONS" in f.read():
                    found.append((family, configuration_auto.CONFIG_MAPPING[family]))
    return found


def tiny_value(name, default):
    """A config field's tiny value, from its name and default."""
    if name in SIZE:
        return SIZE[name]
    if ("dropout" in name or "pdrop" in name or "jitter" in name) and isinstance(default, float):
        return 0.0
    if not isinstance(default, int) or isinstance(default, bool):
        return default
    if name.endswith("_token_id") or name.endswith("_token_index"):
        return VOCAB - 1 if default >= VOCAB else default
    if any(word in name for word in KEEP) or default <= 64:
        return default
    for word, value in PATTERNS:
        if word in name:
            return value
    return 16


def tiny_config(config_class):
    """config_class built tiny: every field by tiny_value, the sub-configs the same way, FIXES
    over them, and one layer of each layer type the family has (its tiny and its default
    config's types) unless FIXES sets the types."""
    values = {}
    for field in dataclasses.fields(config_class):
        value = tiny_value(field.name, field.default)
        if value is not field.default:
            values[field.name] = value
    for name, sub in getattr(config_class, "sub_configs", {}).items():
        if isinstance(sub, type) and issubclass(sub, transformers.PreTrainedConfig) \
                and sub is not configuration_auto.AutoConfig:
            values[name] = tiny_config(sub)
    fixes = FIXES.get(config_class.model_type, {})
    values.update(fixes)
    if "kv_lora_rank" in values:  # multi-head latent attention: keys and values per query head
        values["num_key_value_heads"] = values.get("num_attention_heads", 4)
    try:
        config = config_class(**values)
        kinds = list(getattr(config, "layer_types", None) or [])
    except Exception:
        config, kinds = None, []
    kinds = list(dict.fromkeys(kinds + list(getattr(config_class(), "layer_types", None) or [])))
    if (len(kinds) > 1 or config is None) and "layer_types" not in fixes \
            and "layers_block_type" not in fixes:
        name = "layers_block_type" if "layers_block_type" in {
            f.name for f in dataclasses.fields(config_class)} else "layer_types"
        try:  # one layer of each type
            return config_class(**dict(values, **{name: kinds},
                                       num_hidden_layers=max(2, len(kinds))))
        except Exception:
            if config is None:
                raise
    return config


class MaskReadings:
    """Wraps attention2d.transformers' two readings of transformers' mask function (its name and
    local_size, then its parts) and keeps each call's pair."""

    def __init__(self):
        self.pairs, self._pending = [], []
        self._names, self._parts = hf._mask_from_names, hf._mask_from_parts

    def names(self, mask_function, local_size, config, use_vmap):
        reading = self._names(mask_function, local_size, config, use_vmap)
        self._pending.append((getattr(mask_function, "__qualname__", "?"), local_size, reading))
        return reading

    def parts(self, mask_function):
        reading = self._parts(mask_function)
        name, local_size, by_name = self._pending.pop() if self._pending else ("?", None, None)
        self.pairs.append((name, local_size, by_name, reading))
        return reading

    def disagreements(self):
        return ["%s (local_size=%s): name %s, parts %s" % (name, size, a, b)
                for name, size, a, b in self.pairs
                if a is None or (a[0], a[1], bool(a[2])) != (b[0], b[1], bool(b[2]))]

    def __enter__(self):
        hf._mask_from_names, hf._mask_from_parts = self.names, self.parts
        return self

    def __exit__(self, *exc):
        hf._mask_from_names, hf._mask_from_parts = self._names, self._parts


def build(config_class, implementation, dtype=torch.float32):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = tiny_config(config_class)
        torch.manual_seed(1234)
        extra = dict(experts_implementation="eager") if dtype == torch.float64 else {}
        model = modeling_auto.AutoModelForCausalLM.from_config(  # (grouped_mm takes no fp64)
            config, attn_implementation=implementation, **extra)
    if hasattr(model, "set_default_language"):  # X-MOD: the language of its adapters
        model.set_default_language(config.languages[0])
    return model.to(dtype)


def inputs(config):
    """input_ids [ROWS, SEQ] without the config's special tokens, and the generator that then
    draws the loss's weights."""
    special = set()
    for cfg in (config, getattr(config, "text_config", None)):
        for name, value in (vars(cfg) if cfg is not None else {}).items():
            if "token" in name and isinstance(value, int) and not isinstance(value, bool):
                special.add(value)
    allowed = torch.tensor([i for i in range(VOCAB) if i not in special])
    gen = torch.Generator().manual_seed(7)
    ids = allowed[torch.randint(0, len(allowed), (ROWS, SEQ), generator=gen)]
    return ids, gen


def run(model, ids, positions, weights):
    out = model(input_ids=ids, position_ids=positions)
    logits = out.logits.double()
    (logits * weights[:, :, :logits.shape[-1]]).sum().backward()
    return logits.detach()


def gradients(model, summed=False):
    """{name: fp64 gradient} (summed over the ranks: the sharded model's)."""
    grads = {}
    for name, p in model.named_parameters():
        grad = torch.zeros_like(p, dtype=torch.float64) if p.grad is None else p.grad.double()
        if summed and P > 1:
            dist.all_reduce(grad)
        grads[name] = grad
    return grads


def errors_of(logits, grads, want_logits, want_grads):
    """Relative errors of this rank's logits (the worst rank's) and of each gradient. A gradient
    below GRADIENT_FLOOR of the whole model's gradient norm is measured against that floor:
    the gradients of the key biases are 0 in exact arithmetic (the softmax does not see them),
    rounding noise (1e-11 of the whole) on both sides, as relative errors ~1."""
    floor = GRADIENT_FLOOR * sum(float(w.norm()) ** 2 for w in want_grads.values()) ** 0.5
    errors = {"logits": max(COMM.allgather(relative_error(logits, want_logits)))}
    for name, grad in grads.items():
        want = want_grads[name]
        errors[name] = float((grad - want).norm()) / max(float(want.norm()), floor, 1e-300)
    return errors


def reference_run(family, config_class):
    """(the eager model, input_ids, the loss's weights [rows, SEQ, 1024], its logits, whether
    in eval mode), or the reason it cannot be run (the loss: the logits' sum weighted by the
    weights, so any model's logits serve, no labels)."""
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        meta = modeling_auto.AutoModelForCausalLM.from_config(tiny_config(config_class),
                                                              attn_implementation="eager")
    count = sum(p.numel() for p in meta.parameters())
    if count > MAX_PARAMETERS:
        return "not tiny: %d parameters" % count
    reference = build(config_class, "eager")
    ids, gen = inputs(reference.config)
    weights = torch.randn(ROWS, SEQ, 1024, generator=gen)
    positions = torch.arange(SEQ)[None]
    with torch.no_grad():
        try:
            torch.manual_seed(1)
            first = reference(input_ids=ids, position_ids=positions).logits.double()
        except Exception:  # one row where eager fails at two (Qwen4-Exp's indexer indexes the
            ids, weights = ids[:1], weights[:1]  # rope by the batch's rows, position_ids by one)
            torch.manual_seed(1)
            first = reference(input_ids=ids, position_ids=positions).logits.double()
    torch.manual_seed(2)
    logits = run(reference, ids, positions, weights)
    # a model whose training mode draws random numbers (a router that samples experts) is
    # compared in eval mode (gradients are still taken)
    evaluate = not torch.equal(first, logits)
    if evaluate:
        reference.zero_grad(set_to_none=True)
        reference.eval()
        logits = run(reference, ids, positions, weights)
    return reference, ids, weights, logits, evaluate


MASK_READINGS = {}  # family -> the mask-function readings compared


def compare(family, config_class):
    """("equal", errors) / ("refused", message) / ("skipped", why) / ("DIFFERENT", what) /
    ("UNREFUSED", error): collective, the same verdict on every rank."""
    if family in EXCLUDED:
        return "skipped", "excluded: " + EXCLUDED[family]
    try:
        reference, ids, weights, want, evaluate = reference_run(family, config_class)
    except Exception as e:  # the same on every rank (the same code and seeds)
        return "skipped", "eager: %s: %s" % (type(e).__name__, " ".join(str(e).split())[:200])
    if isinstance(reference, str):
        return "skipped", reference
    try:
        sharded = build(config_class, "attention2d")
        sharded.load_state_dict(reference.state_dict())
    except Exception as e:  # (GIT: its text attention from a table of its own)
        return "skipped", "transformers builds no model with attn_implementation='attention2d': " \
            "%s: %s" % (type(e).__name__, " ".join(str(e).split())[:200])
    if evaluate:
        sharded.eval()
    mine = attention2d.shard(torch.arange(SEQ)[None], "contiguous")
    with MaskReadings() as readings:
        try:
            got = run(sharded, ids[:, mine[0]], mine, weights[:, mine[0]])
            outcome = ("ran", "")
        except attention2d.Error as e:
            outcome = ("refused", str(e))
        except Exception as e:
            outcome = ("error", "%s: %s" % (type(e).__name__, " ".join(str(e).split())[:300]))
    disagree = readings.disagreements()
    MASK_READINGS[family] = len(readings.pairs)
    verdicts = COMM.allgather((outcome, disagree))
    if any(d for _, d in verdicts):
        return "DIFFERENT", "the mask readings disagree: %s" % [d for _, d in verdicts]
    outcomes = [o for o, _ in verdicts]
    if len(set(outcomes)) > 1:
        return "DIFFERENT", "the ranks ended differently: %s" % outcomes
    if outcome[0] != "ran":  # an error other than attention2d's, where eager runs: a finding
        return ("refused", outcome[1]) if outcome[0] == "refused" else \
            ("UNREFUSED", "raised where eager does not: " + outcome[1])
    shard = mine[0]
    ours = gradients(sharded, summed=True)
    eager = gradients(reference)
    errors = errors_of(got, ours, want[:, shard], eager)
    worst = max(errors, key=errors.get)
    summary = "logits %.1e, worst %s %.1e%s" % (errors["logits"], worst, errors[worst],
                                                 " (eval mode)" if evaluate else "")
    if errors[worst] <= FP32:
        return "equal", summary
    # Beyond 1e-5 of fp32 eager: both against the fp64 eager model on the same weights, where
    # attention2d must be within FP32 or RATIO x fp32 eager's own error, quantity by quantity
    # (a model whose fp32 rounding is amplified, as Gemma 4's unscaled scores amplify it).
    exact = build(config_class, "eager", torch.float64)
    exact.load_state_dict(reference.state_dict())
    if evaluate:
        exact.eval()
    exact_logits = run(exact, ids, torch.arange(SEQ)[None], weights.double())
    exact_grads = gradients(exact)
    ours = errors_of(got, ours, exact_logits[:, shard], exact_grads)
    eager = errors_of(want[:, shard], eager, exact_logits[:, shard], exact_grads)
    ratio = {name: ours[name] / max(eager[name], FP32) for name in ours}
    worst = max(ratio, key=ratio.get)
    summary += ("; against fp64 eager (attention2d, fp32 eager): logits %.1e, %.1e; worst %s "
                "%.1e, %.1e" % (ours["logits"], eager["logits"], worst, ours[worst],
                                eager[worst]))
    return ("equal" if ratio[worst] <= RATIO else "DIFFERENT"), summary


def test_every_family_equals_eager_or_is_refused(capsys):
    attention2d.transformers.register()
    attention2d.watchdog(120)  # a rank left waiting: a report within 2 minutes, not 5
    results, start = [], time.time()
    chosen = os.environ.get("A2D_HF_FAMILIES")  # (a comma-separated subset, by hand)
    for family, config_class in families():
        if chosen and family not in chosen.split(","):
            continue
        t0 = time.time()
        verdict, detail = compare(family, config_class)
        results.append((family, verdict, detail, time.time() - t0))
    lines = ["%-26s %-9s %5.2fs  %s" % (family, verdict, seconds, detail[:300])
             for family, verdict, detail, seconds in results]
    counts = {}
    for _, verdict, _, _ in results:
        counts[verdict] = counts.get(verdict, 0) + 1
    summary = "P=%d: %d families, %s; mask readings agreed in %d families (%d calls) (%.0f s)" % (
        P, len(results), ", ".join("%d %s" % (n, v) for v, n in sorted(counts.items())),
        sum(1 for n in MASK_READINGS.values() if n), sum(MASK_READINGS.values()),
        time.time() - start)
    if RANK == 0:
        with capsys.disabled():
            print("\n" + "\n".join(lines) + "\n" + summary)
    wrong = [line for line, (_, verdict, _, _) in zip(lines, results)
             if verdict in ("DIFFERENT", "UNREFUSED")]
    assert not wrong, "silent differences or unrefused errors:\n" + "\n".join(wrong)
