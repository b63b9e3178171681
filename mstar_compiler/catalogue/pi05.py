"""π0.5 family (a vision-language-action policy): `pi05_prefix` and `pi05_expert`. Torch-free.

π0.5 reads its cameras and instruction once and then denoises an action chunk over a few flow-matching
steps. `pi05_prefix` is PaliGemma: a SigLIP vision tower and projector turn each camera image into rows,
which replace the image placeholders of the prompt, and a Gemma LM runs over the whole prefix with
bidirectional attention. Its output is the prefix's keys and values, one row per prefix token holding
every layer's K and V (`kv_row_width` = layers x 2 x kv heads x head dim): what the action expert attends
to at every step, computed once. `pi05_expert` is one flow step: the action expert (a smaller Gemma
whose norms are modulated by the step's time) runs the chunk's rows attending to the prefix rows and to
each other, and the chunk moves one Euler step (x <- x - v / steps, time 1 -> 0). Dims are one dict for
both kinds, the flattened keys of transformers' `PI05Config` (`vision_*` its SigLIP's, `expert_*` its action
expert's, the rest its Gemma's); the expert has the Gemma's layer count, kv heads and head dim, as the
shared attention needs.
"""
from __future__ import annotations

from mstar_compiler.catalogue import Dims, Family, KindSpec, Port


def _gemma_layer(h: int, inter: int, heads: int, kv: int, hd: int) -> int:
    return h * heads * hd * 2 + h * kv * hd * 2 + 3 * h * inter


def prefix_params(d: Dims) -> int:
    """Exact parameter count of the runtime `pi05_prefix` module."""
    vh, vi, p = d["vision_hidden_size"], d["vision_intermediate_size"], d["patch_size"]
    patches = (d["image_size"] // p) ** 2
    vision_layer = 4 * vh + 4 * (vh * vh + vh) + (vh * vi + vi) + (vi * vh + vh)
    vision = 3 * p * p * vh + vh + patches * vh + d["vision_num_hidden_layers"] * vision_layer + 2 * vh
    h = d["hidden_size"]
    layer = _gemma_layer(h, d["intermediate_size"], d["num_attention_heads"], d["num_key_value_heads"],
                         d["head_dim"]) + 2 * h
    return vision + vh * h + h + d["vocab_size"] * h + d["num_hidden_layers"] * layer + h


def expert_params(d: Dims) -> int:
    """Exact parameter count of the runtime `pi05_expert` module."""
    eh, a = d["expert_hidden_size"], d["max_action_dim"]
    norm = eh * 3 * eh + 3 * eh
    layer = _gemma_layer(eh, d["expert_intermediate_size"], d["expert_num_attention_heads"],
                         d["num_key_value_heads"], d["head_dim"]) + 2 * norm
    return d["num_hidden_layers"] * layer + norm + (a * eh + eh) + 2 * (eh * eh + eh) + (eh * a + a)


def _kv_row(d: dict) -> dict:
    return {**d, "kv_row_width": d["num_hidden_layers"] * 2 * d["num_key_value_heads"] * d["head_dim"]}


_COMMON = {"layer_norm_eps": 1e-6, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "min_period": 4e-3, "max_period": 4.0,
           "max_cameras": 3}
PRESETS = {
    "tiny": _kv_row({**_COMMON, "vision_hidden_size": 32, "vision_intermediate_size": 64, "vision_num_hidden_layers": 2,
                     "vision_num_attention_heads": 2, "patch_size": 4, "image_size": 16, "vocab_size": 300,
                     "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                     "num_key_value_heads": 1, "head_dim": 16, "image_token_id": 258, "expert_hidden_size": 32,
                     "expert_intermediate_size": 64, "expert_num_attention_heads": 4, "chunk_size": 5,
                     "max_action_dim": 6}),
    # CPU benchmarks (tools/bench/suite_pi05.py): 4 layers, widths 512 / 256, 64 px cameras of 8 px patches
    "bench-mid": _kv_row({**_COMMON, "vision_hidden_size": 256, "vision_intermediate_size": 1024,
                          "vision_num_hidden_layers": 4, "vision_num_attention_heads": 4, "patch_size": 8,
                          "image_size": 64, "vocab_size": 300, "hidden_size": 512, "intermediate_size": 2048,
                          "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 64,
                          "image_token_id": 258, "expert_hidden_size": 256, "expert_intermediate_size": 1024,
                          "expert_num_attention_heads": 8, "chunk_size": 50, "max_action_dim": 32}),
    # lerobot/pi05_base: PaliGemma (SigLIP so400m/14 at 224 px, Gemma 2B) and the Gemma 300M action expert
    "pi05-base": _kv_row({**_COMMON, "vision_hidden_size": 1152, "vision_intermediate_size": 4304,
                          "vision_num_hidden_layers": 27, "vision_num_attention_heads": 16, "patch_size": 14,
                          "image_size": 224, "vocab_size": 257152, "hidden_size": 2048, "intermediate_size": 16384,
                          "num_hidden_layers": 18, "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256,
                          "image_token_id": 257152, "expert_hidden_size": 1024, "expert_intermediate_size": 4096,
                          "expert_num_attention_heads": 8, "chunk_size": 50, "max_action_dim": 32}),
}

ARGS = {"weights": None, "seed": 0}

PI05_PREFIX = KindSpec(
    kind="pi05_prefix",
    doc="π0.5's PaliGemma over the cameras and the prompt, bidirectional: the prefix's keys and values per row",
    inputs=(Port("tokens", "tokens", ("T",)), Port("cameras", "video", ("F", 3, "image_size", "image_size"))),
    outputs=(Port("prefix", "hidden", ("T", "kv_row_width")),),
    presets=PRESETS,
    num_params=prefix_params,
    can_batch=True,
    tp_divides=("num_attention_heads",),
    args=ARGS,
    executor="pi05_prefix",
)

PI05_EXPERT = KindSpec(
    kind="pi05_expert",
    doc="π0.5's action expert: one flow-matching step of an action chunk attending to the prefix's keys and values",
    inputs=(Port("prefix", "hidden", ("T", "kv_row_width")),
            Port("actions", "actions", ("chunk_size", "max_action_dim"), optional=True)),   # the loop's carry
    outputs=(Port("actions", "actions", ("chunk_size", "max_action_dim")),),
    presets=PRESETS,
    num_params=expert_params,
    can_batch=True,
    tp_divides=("expert_num_attention_heads",),
    args=ARGS,
    executor="pi05_expert",
)

KINDS: tuple[KindSpec, ...] = (PI05_PREFIX, PI05_EXPERT)

FAMILY = Family(
    "pi05", KINDS,
    components={"pi05_prefix": "runtime.models.pi05.pi05_prefix:Pi05Prefix",
                "pi05_expert": "runtime.models.pi05.pi05_expert:Pi05Expert"},
    executors={"pi05_prefix": "runtime.models.pi05.executors:prefix_executor",
               "pi05_expert": "runtime.models.pi05.executors:expert_executor"},
    serving="runtime.models.pi05.serving:SERVING",
)
