"""The graph copies the served tts comparisons compile, written under bench-results/graphs/.

Nothing in graphs/ changes; each copy is the project's graph plus what the comparison needs:
  orpheus-streamed.yaml  graphs/orpheus.yaml plus a preset `bench`: the tiny LM (`orpheus-tiny`)
                         with the full-size SNAC 24 kHz decoder (19.8M parameters, where
                         streaming costs or saves time); the lm->snac stream keeps its policy
  orpheus-gtd.yaml       the same, with the lm->snac policy `fixed: <max_tokens maximum + 1>`: the
                         buffer never fills, so it releases one chunk, all tokens, when the LM has
                         finished: one SNAC decode per request (generate-then-decode)
  qwen3_omni-mid.yaml    graphs/qwen3_omni.yaml with node `dims:` that widen the tiny kinds into a
                         mid-size model (MID_DIMS; the thinker the heaviest part, as in the real
                         model) and a preset `mid` selecting them. The tiny preset is pure overhead
                         on CPU (4 s of speech in 0.2 s), and the thinker's kind (`qwen3_moe_lm`)
                         has no preset between tiny and 30B-A3B, so the widening lives in the copy.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import yaml

from bench.registry import Context
from bench.peer_mstar import compile_plan

HEADER = "# Written by tools/bench/tts_graphs.py from graphs/{source}: a benchmark copy, not a project graph.\n"
ORPHEUS_STREAM = "audio_tokens"
MID_DIMS: dict[str, dict[str, Any]] = {
    # head_dim 16: the M-RoPE lanes of the thinker preset it widens (qwen3-omni-tiny's [4, 2, 2], half of 16)
    "thinker": {"hidden_size": 768, "num_hidden_layers": 8, "num_attention_heads": 12, "num_key_value_heads": 4,
                "head_dim": 16, "intermediate_size": 2048, "num_experts": 8, "num_experts_per_tok": 2,
                "moe_intermediate_size": 768},
    "talker": {"thinker_hidden_size": 768, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
               "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "mrope_section": [16, 8, 8],
               "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 256,
               "shared_expert_intermediate_size": 512, "accept_hidden_layer": 3},
    "code_predictor": {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 2,
                       "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64},
    "code2wav": {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 768,
                 "decoder_dim": 256},
    "audio_enc": {"output_dim": 768},
    "vision_enc": {"out_hidden_size": 768},
}


def _copy(ctx: Context, source: str, name: str, edit: Callable[[dict], None]) -> Path:
    graph = yaml.safe_load((ctx.root / "graphs" / source).read_text())
    edit(graph)
    path = ctx.root / "bench-results/graphs" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HEADER.format(source=source) + yaml.safe_dump(graph, sort_keys=False))
    return path


def _plan(ctx: Context, graph: Path, preset: str, placement: str) -> Path:
    out = ctx.root / "bench-results/plans" / f"{graph.stem}-{preset}-{placement}.plan.bin"
    return compile_plan(graph, out, "--preset", preset, "--placement", placement)


def orpheus_policy(ctx: Context) -> dict[str, Any]:
    """The lm->snac chunk policy of graphs/orpheus.yaml, e.g. {"sliding": {"window": 28, "stride": 7}}."""
    return yaml.safe_load((ctx.root / "graphs/orpheus.yaml").read_text())["streams"][ORPHEUS_STREAM]["policy"]


def _bench_preset(graph: dict) -> None:
    graph["presets"]["bench"] = {"doc": "tiny LM, full-size SNAC 24 kHz (benchmark)", "dtype": "fp32",
                                 "random_weights": True,    # seeded random weights, said on /v1/models
                                 "device_memory": "1GiB", "nodes": {"lm": "orpheus-tiny", "snac": "24khz"}}


def _decode_at_end(graph: dict, k: int) -> None:
    _bench_preset(graph)
    graph["streams"][ORPHEUS_STREAM]["policy"] = {"fixed": k}


def orpheus_plans(ctx: Context) -> tuple[Path, Path, int]:
    """(streamed plan, generate-then-decode plan, the baseline's fixed chunk size), preset `bench`, one rank."""
    k = yaml.safe_load((ctx.root / "graphs/orpheus.yaml").read_text())["params"]["max_tokens"]["maximum"] + 1
    streamed = _plan(ctx, _copy(ctx, "orpheus.yaml", "orpheus-streamed", _bench_preset), "bench", "single")
    gtd = _plan(ctx, _copy(ctx, "orpheus.yaml", "orpheus-gtd", lambda g: _decode_at_end(g, k)), "bench", "single")
    return streamed, gtd, k


def omni_plan(ctx: Context, placement: str) -> Path:
    """The mid-size Qwen3-Omni copy compiled for `placement` (single | thinker_talker)."""
    def widen(graph: dict) -> None:
        for node, dims in MID_DIMS.items():
            graph["nodes"][node]["dims"] = dims
        tiny = graph["presets"]["tiny"]     # its random weights and stream cuts (the tiny encoder's window)
        graph["presets"]["mid"] = {"doc": "tiny kinds widened by node dims (benchmark)", "dtype": "fp32",
                                   "random_weights": tiny["random_weights"], "streams": tiny["streams"],
                                   "device_memory": "2GiB",
                                   "nodes": {**{node: "tiny" for node in graph["nodes"]}, **tiny.get("nodes", {})},
                                   "params": {"max_tokens": 16, "max_audio_frames": 32}}

    return _plan(ctx, _copy(ctx, "qwen3_omni.yaml", "qwen3_omni-mid", widen), "mid", placement)


def node_params(plan_path: Path) -> dict[str, int]:
    """Parameters per node of a compiled plan (the compiler's count)."""
    from mstar_compiler.plan import load_plan
    return {n.name: n.num_params for n in load_plan(plan_path).nodes}
