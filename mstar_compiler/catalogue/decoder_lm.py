"""Catalogue entries for the decoder-only language models: llama_lm, qwen2_lm, qwen3_lm, qwen3_moe_lm.

Torch-free. Dims use the key names of the HF `config.json` files (hidden_size,
num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, intermediate_size,
vocab_size, rope_theta, rope_scaling, rms_norm_eps, tie_word_embeddings, attention_bias,
num_experts, num_experts_per_tok, moe_intermediate_size, norm_topk_prob, ...).
`num_params` mirrors `runtime.model_executor.layers.decoder.DecoderLM` exactly; `runtime` implements the
kinds in `runtime/model_executor/components/<kind>.py`.

Family differences (what the runtime and the counts below agree on):
  * llama_lm:     `attention_bias` puts a bias on q, k, v and o; `mlp_bias` on the MLP.
  * qwen2_lm:     q, k, v always carry a bias, o never.
  * qwen3_lm:     per-head RMSNorm on q and k (q_norm, k_norm); `attention_bias` as llama.
  * qwen3_moe_lm: qwen3 attention; sparse-MoE MLP (router + experts) on every layer
                  except `mlp_only_layers` / those skipped by `decoder_sparse_step`.
"""
from __future__ import annotations

from typing import Any

from mstar_compiler.catalogue import Dims, Family, KindSpec, Linear, Port

# Each family: (qkv bias always on, q/k norm, sparse MoE MLP)
_FAMILIES: dict[str, tuple[bool, bool, bool]] = {
    "llama_lm": (False, False, False),
    "qwen2_lm": (True, False, False),
    "qwen3_lm": (False, True, False),
    "qwen3_moe_lm": (False, True, True),
}

INPUTS = (
    Port("tokens", "tokens", ("T",)),
    # multimodal prompts: encoder outputs that replace token embeddings at some positions
    Port("embeds", "hidden", ("T", "hidden_size"), optional=True),
)
# the Qwen3-Omni thinker also takes DeepStack features: per early layer, rows added to the
# hidden states at the `embeds` rows after that layer (runtime/models/qwen3_omni/thinker.py)
MOE_INPUTS = (*INPUTS, Port("deepstack", "hidden", ("D", "T", "hidden_size"), optional=True))
OUTPUTS = (
    Port("token", "tokens", ("T",), stream=True),                  # sampled tokens, one per decode step
    Port("hidden", "hidden", ("T", "hidden_size"), stream=True),   # last-layer hidden states
)

ARGS: dict[str, Any] = {
    "weights": None,              # safetensors file or directory (HF layout); None: seeded random weights
    "seed": 0,                    # seed of the random weights when `weights` is None
    "attention_backend": "auto",  # torch | triton | flashinfer | auto (flashinfer on CUDA when importable)
    "cpu_compile": False,         # on CPU, decode steps of its capture regions compiled by inductor per bucket
}


def head_dim(dims: Dims) -> int:
    """Per-head size: `head_dim` when given, else hidden_size / num_attention_heads."""
    return int(dims.get("head_dim") or dims["hidden_size"] // dims["num_attention_heads"])


def is_sparse_layer(dims: Dims, layer: int) -> bool:
    """Whether decoder layer `layer` uses the sparse-MoE MLP (Qwen3-MoE rule)."""
    if int(dims.get("num_experts", 0)) <= 0 or layer in dims.get("mlp_only_layers", ()):
        return False
    return (layer + 1) % int(dims.get("decoder_sparse_step", 1)) == 0


def _attention_params(dims: Dims, qkv_bias: bool, qk_norm: bool) -> int:
    h, d = dims["hidden_size"], head_dim(dims)
    q, kv = dims["num_attention_heads"] * d, dims["num_key_value_heads"] * d
    n = h * (q + 2 * kv) + q * h
    if qkv_bias or dims.get("attention_bias", False):
        n += q + 2 * kv
    if dims.get("attention_bias", False):
        n += h
    if qk_norm:
        n += 2 * d
    return n


def _mlp_params(dims: Dims, sparse: bool) -> int:
    h = dims["hidden_size"]
    if sparse:
        e, i = dims["num_experts"], dims["moe_intermediate_size"]
        return e * h + e * 3 * h * i
    i = dims["intermediate_size"]
    return 3 * h * i + (2 * i + h if dims.get("mlp_bias", False) else 0)


def attention_linears(dims: Dims) -> list[Linear]:
    """The fused q/k/v projection and the output projection of one layer (quantizable: mstar_compiler.quant)."""
    h, d = dims["hidden_size"], head_dim(dims)
    q, kv = dims["num_attention_heads"] * d, dims["num_key_value_heads"] * d
    return [Linear(q + 2 * kv, h), Linear(h, q, splits_input=True)]


def swiglu_linears(hidden: int, intermediate: int, count: int = 1) -> list[Linear]:
    """The fused gate/up and the down projection of `count` SwiGLU MLPs (or experts)."""
    return [Linear(2 * intermediate, hidden, count), Linear(hidden, intermediate, count, splits_input=True)]


def _quant_linears(dims: Dims) -> list[Linear]:
    out: list[Linear] = []
    for layer in range(dims["num_hidden_layers"]):
        out += attention_linears(dims)
        if is_sparse_layer(dims, layer):
            out += swiglu_linears(dims["hidden_size"], dims["moe_intermediate_size"], dims["num_experts"])
        else:
            out += swiglu_linears(dims["hidden_size"], dims["intermediate_size"])
    return out


def _num_params(kind: str):
    qkv_bias, qk_norm, _ = _FAMILIES[kind]

    def count(dims: Dims) -> int:
        h, v = dims["hidden_size"], dims["vocab_size"]
        n = v * h + h + (0 if dims.get("tie_word_embeddings", False) else v * h)
        for layer in range(dims["num_hidden_layers"]):
            n += 2 * h + _attention_params(dims, qkv_bias, qk_norm)
            n += _mlp_params(dims, is_sparse_layer(dims, layer))
        return n

    return count


def kv_bytes_per_token(dims: Dims, dtype_bytes: int) -> int:
    """K and V of every layer for one token."""
    return 2 * dims["num_hidden_layers"] * dims["num_key_value_heads"] * head_dim(dims) * dtype_bytes


_TINY: dict[str, Any] = {
    "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "intermediate_size": 128, "vocab_size": 512, "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "max_position_embeddings": 2048,
}

_LLAMA3_SCALING = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}

LLAMA_PRESETS: dict[str, Dims] = {
    "tiny": _TINY,
    "smollm2-135m": {
        "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
        "head_dim": 64, "intermediate_size": 1536, "vocab_size": 49152, "rope_theta": 100000.0,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "max_position_embeddings": 8192,
    },
    # Llama-3.2-3B with the Orpheus vocabulary (text + 7 x 4096 audio tokens + specials)
    "orpheus-3b": {
        "hidden_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 24, "num_key_value_heads": 8,
        "head_dim": 128, "intermediate_size": 8192, "vocab_size": 156940, "rope_theta": 500000.0,
        "rope_scaling": _LLAMA3_SCALING, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
        "max_position_embeddings": 131072,
    },
    # tiny dims, but a vocabulary that holds the audio ids (128266 + 7 * 4096 <= 156940)
    "orpheus-tiny": {**_TINY, "vocab_size": 156940, "rope_theta": 500000.0,
                     "rope_scaling": _LLAMA3_SCALING, "tie_word_embeddings": True},
}

QWEN2_PRESETS: dict[str, Dims] = {
    "tiny": {**_TINY, "rope_theta": 1000000.0},
    # BAGEL's language backbone (per expert)
    "qwen2.5-7b": {
        "hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
        "head_dim": 128, "intermediate_size": 18944, "vocab_size": 152064, "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "max_position_embeddings": 32768,
    },
}

QWEN3_PRESETS: dict[str, Dims] = {
    "tiny": {**_TINY, "rope_theta": 1000000.0},
    "qwen3-0.6b": {
        "hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
        "head_dim": 128, "intermediate_size": 3072, "vocab_size": 151936, "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "max_position_embeddings": 40960,
        "attention_bias": False,
    },
}

QWEN3_MOE_PRESETS: dict[str, Dims] = {
    "tiny": {**_TINY, "rope_theta": 1000000.0, "num_experts": 4, "num_experts_per_tok": 2,
             "moe_intermediate_size": 32, "norm_topk_prob": True},
    # Qwen3-Omni-30B-A3B thinker (text part); interleaved M-RoPE over (t, h, w) positions
    "qwen3-30b-a3b": {
        "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
        "head_dim": 128, "intermediate_size": 6144, "vocab_size": 151936, "rope_theta": 1000000.0,
        "rope_scaling": {"rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": True},
        "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "max_position_embeddings": 65536,
        "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
        "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
    },
}
# the tiny Qwen3-Omni thinker: interleaved M-RoPE (t, h, w lanes 4 + 2 + 2 of head_dim 16) for image rows
QWEN3_MOE_PRESETS["qwen3-omni-tiny"] = {**QWEN3_MOE_PRESETS["tiny"], "rope_scaling": {
    "rope_type": "default", "mrope_section": [4, 2, 2], "mrope_interleaved": True}}
# Qwen3-Omni-30B-A3B's thinker: the text model above with the Omni vocabulary (its published
# thinker.model.embed_tokens / thinker.lm_head are 152,064 rows, not Qwen3-30B-A3B's 151,936)
QWEN3_MOE_PRESETS["qwen3-omni-30b-a3b"] = {**QWEN3_MOE_PRESETS["qwen3-30b-a3b"], "vocab_size": 152064}

_DOCS = {
    "llama_lm": "Llama decoder LM (GQA, RoPE with llama3 scaling, SwiGLU); SmolLM2, Orpheus",
    "qwen2_lm": "Qwen2 decoder LM (Llama with q/k/v bias); BAGEL's backbone",
    "qwen3_lm": "Qwen3 decoder LM (Llama with per-head q/k RMSNorm)",
    "qwen3_moe_lm": "Qwen3-MoE decoder LM (Qwen3 attention, top-k routed experts); Qwen3-Omni thinker",
}

_PRESETS = {
    "llama_lm": LLAMA_PRESETS,
    "qwen2_lm": QWEN2_PRESETS,
    "qwen3_lm": QWEN3_PRESETS,
    "qwen3_moe_lm": QWEN3_MOE_PRESETS,
}


def _spec(kind: str) -> KindSpec:
    return KindSpec(
        kind=kind,
        doc=_DOCS[kind],
        inputs=MOE_INPUTS if kind == "qwen3_moe_lm" else INPUTS,
        outputs=OUTPUTS,
        presets=_PRESETS[kind],
        num_params=_num_params(kind),
        quant_linears=_quant_linears,
        has_kv_cache=True,
        can_batch=True,
        # sparse-MoE routing reads the per-expert token counts back to the host to size each
        # expert's GEMM (runtime/model_executor/layers/moe.py): a CUDA graph cannot capture that, so MoE kinds run eagerly
        is_capture_safe=not _FAMILIES[kind][2],
        kv_bytes_per_token=kv_bytes_per_token,
        tp_divides=("num_attention_heads", "num_key_value_heads"),
        args=ARGS,
    )


KINDS: tuple[KindSpec, ...] = tuple(_spec(kind) for kind in _FAMILIES)


# the family, declared once: its kinds, and the runtime that implements them (runtime/models/decoder_lm/)
FAMILY = Family(
    "decoder_lm", KINDS,
    components={
        "llama_lm": "runtime.models.decoder_lm.llama_lm:LlamaLM",
        "qwen2_lm": "runtime.models.decoder_lm.qwen2_lm:Qwen2LM",
        "qwen3_lm": "runtime.models.decoder_lm.qwen3_lm:Qwen3LM",
        "qwen3_moe_lm": "runtime.models.decoder_lm.qwen3_moe_lm:Qwen3MoeLM",
    },
    executors={
        "decoder_lm": "runtime.models.decoder_lm.executors:decoder_lm_executor",
    },
)
