"""Which nodes get a kind-specific executor: stream producers/consumers and rollouts.

`specialised_executor(plan, node, module, rank)` is asked first by `executor_for`; None
means the generic decoder-LM or stateless executor fits. Some choices depend on the
plan, not only the kind: a `llama_lm` that streams into a `snac_decoder` is Orpheus'
LM; a `qwen3_moe_lm` that streams into a talker is Qwen3-Omni's thinker.
"""
from __future__ import annotations

from typing import Any

from torch import nn

from mstar_compiler.plan import Node, Plan


def _stream_consumer_kind(plan: Plan, node: Node) -> tuple[str, dict[str, Any]] | None:
    """(kind, dims) of the node that `node` streams into, if any."""
    for s in plan.streams:
        if s.src_node == node.name:
            dst = plan.node(s.dst_node)
            return dst.kind, dict(dst.dims)
    return None


def specialised_executor(plan: Plan, node: Node, module: nn.Module, rank: int) -> Any | None:
    from runtime.executors import orpheus, qwen3_omni, vjepa2
    consumer = _stream_consumer_kind(plan, node)
    kind = node.kind
    if kind == "llama_lm" and consumer and consumer[0] == "snac_decoder":
        return orpheus.OrpheusLMExecutor(node, module, rank, consumer[1])
    if kind == "qwen3_moe_lm" and consumer and consumer[0] == "qwen3_omni_talker":
        return qwen3_omni.ThinkerExecutor(node, module, rank, qwen3_omni.tts_token_ids(consumer[1]), plan)
    if kind == "qwen3_omni_code_predictor":
        talker = next((n for n in plan.nodes if n.kind == "qwen3_omni_talker"), None)
        eos = int(talker.dims["codec_eos_token_id"]) if talker else -1
        return qwen3_omni.CodePredictorExecutor(node, module, eos)
    simple = {"snac_decoder": orpheus.SnacExecutor, "qwen3_omni_code2wav": qwen3_omni.Code2WavExecutor,
              "vjepa2_encoder": vjepa2.EncoderExecutor}
    if kind in simple:
        return simple[kind](node, module)
    ranked = {"qwen3_omni_talker": qwen3_omni.TalkerExecutor, "vjepa2_ac_predictor": vjepa2.RolloutExecutor}
    if kind in ranked:
        return ranked[kind](node, module, rank)
    return None
