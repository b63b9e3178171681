"""Small factories for the LM tests: tiny dims, transformers twins with the same weights, a paged runner."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch

from mstar_compiler.catalogue import load_catalogue
from runtime.model_executor.components import component_class
from runtime.model_executor.kv import KVBlockManager, PagedKVCache
from runtime.model_executor.layers import DecoderLM

LLAMA3_SMALL = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64}

# (kind, dims) pairs the parity tests cover: every family, plus variants for the optional features
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama_lm", {}),
    "llama-tied-llama3-bias": ("llama_lm", {"tie_word_embeddings": True, "rope_scaling": LLAMA3_SMALL,
                                            "attention_bias": True, "mlp_bias": True}),
    "qwen2": ("qwen2_lm", {}),
    "qwen3": ("qwen3_lm", {}),
    "qwen3_moe": ("qwen3_moe_lm", {}),
    "qwen3_moe-unnormed-dense0": ("qwen3_moe_lm", {"norm_topk_prob": False, "mlp_only_layers": [0]}),
}


def tiny_dims(kind: str, **overrides: Any) -> dict[str, Any]:
    return {**load_catalogue()[kind].presets["tiny"], **overrides}


def build(kind: str, dims: Mapping[str, Any], backend: str = "torch", seed: int = 0) -> DecoderLM:
    return component_class(kind)(dims, {"seed": seed, "attention_backend": backend}).eval()


def hf_config(kind: str, dims: Mapping[str, Any]):
    import transformers

    rope = {"rope_type": "default", **(dims.get("rope_scaling") or {}), "rope_theta": dims["rope_theta"]}
    common = dict(
        hidden_size=dims["hidden_size"], num_hidden_layers=dims["num_hidden_layers"],
        num_attention_heads=dims["num_attention_heads"], num_key_value_heads=dims["num_key_value_heads"],
        head_dim=dims["head_dim"], intermediate_size=dims["intermediate_size"], vocab_size=dims["vocab_size"],
        rms_norm_eps=dims["rms_norm_eps"], tie_word_embeddings=dims.get("tie_word_embeddings", False),
        rope_parameters=rope, max_position_embeddings=dims["max_position_embeddings"])
    if kind == "llama_lm":
        return transformers.LlamaConfig(attention_bias=dims.get("attention_bias", False),
                                        mlp_bias=dims.get("mlp_bias", False), **common)
    if kind == "qwen2_lm":
        return transformers.Qwen2Config(**common)
    if kind == "qwen3_lm":
        return transformers.Qwen3Config(attention_bias=dims.get("attention_bias", False), **common)
    return transformers.Qwen3MoeConfig(
        num_experts=dims["num_experts"], num_experts_per_tok=dims["num_experts_per_tok"],
        moe_intermediate_size=dims["moe_intermediate_size"], norm_topk_prob=dims["norm_topk_prob"],
        mlp_only_layers=dims.get("mlp_only_layers", []), **common)


def hf_twin(kind: str, dims: Mapping[str, Any], seed: int = 0):
    """A transformers model of the same architecture with random weights (norms and biases perturbed too)."""
    import transformers

    classes = {"llama_lm": transformers.LlamaForCausalLM, "qwen2_lm": transformers.Qwen2ForCausalLM,
               "qwen3_lm": transformers.Qwen3ForCausalLM, "qwen3_moe_lm": transformers.Qwen3MoeForCausalLM}
    torch.manual_seed(seed)
    model = classes[kind](hf_config(kind, dims)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def checkpoint_state_dict(hf_model) -> dict[str, torch.Tensor]:
    """The model's tensors under published checkpoint names (transformers 5 stacks MoE experts in memory)."""
    out = {}
    for name, t in hf_model.state_dict().items():
        if name.endswith("mlp.experts.gate_up_proj"):
            prefix = name[: -len("gate_up_proj")]
            for e, w in enumerate(t):
                gate, up = w.chunk(2, dim=0)
                out[f"{prefix}{e}.gate_proj.weight"], out[f"{prefix}{e}.up_proj.weight"] = gate, up
        elif name.endswith("mlp.experts.down_proj"):
            prefix = name[: -len("down_proj")]
            for e, w in enumerate(t):
                out[f"{prefix}{e}.down_proj.weight"] = w
        else:
            out[name] = t
    if hf_model.config.tie_word_embeddings:
        out.pop("lm_head.weight", None)
    return out


class PagedRunner:
    """Drives a DecoderLM over a paged cache the way a worker does: schedule, append, forward."""

    def __init__(self, model: DecoderLM, num_blocks: int = 64, block_size: int = 4) -> None:
        self.model = model
        self.manager = KVBlockManager(num_blocks, block_size)
        self.cache: PagedKVCache = model.make_kv_cache(num_blocks, block_size)

    @torch.no_grad()
    def step(self, chunks: Sequence[tuple[Any, Sequence[int]]]) -> list[torch.Tensor]:
        """Run the new tokens of each (request, tokens) in one packed forward; logits (len, V) per request."""
        ids, positions = [], []
        for req, tokens in chunks:
            if req not in self.manager:
                self.manager.allocate(req, 0)
            start = self.manager.num_tokens(req)
            self.cache.copy_blocks(self.manager.append(req, len(tokens)))
            ids.extend(tokens)
            positions.extend(range(start, start + len(tokens)))
        batch = self.manager.metadata([(req, len(tokens)) for req, tokens in chunks])
        hidden = self.model(torch.tensor(ids), torch.tensor(positions), batch, self.cache)
        logits = self.model.compute_logits(hidden)
        return list(logits.split([len(t) for _, t in chunks]))


def peak_allocated_bytes(fn: Callable[[], Any]) -> int:
    """Most bytes held at once by tensors allocated while `fn()` runs (what was live before
    is not counted). Read from the profiler's allocator events ([memory] records of every
    CPU allocation and free, kernels' scratch buffers included), so the figure depends only on
    the sizes allocated, not on the allocator's caching or the machine's load."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    live = peak = 0
    for e in events:
        live += e.nbytes()           # negative for a free
        peak = max(peak, live)
    return peak
