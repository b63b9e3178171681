"""V-JEPA 2-AC world model family: `vjepa2_encoder` and `vjepa2_ac_predictor`. Torch-free.

The encoder is V-JEPA 2's video ViT (3D tubelet patches, 3-axis RoPE); it turns a clip
of F frames into F/tubelet x (H/patch) x (W/patch) hidden tokens. The action-conditioned
predictor reads the tokens of each frame step with 2 conditioning tokens (action,
state) in front, under a block-causal frame mask with absolute frame positions, and
predicts the next frame's tokens. Because frame t's keys/values depend only on frames
<= t, the predictor keeps a per-frame KV cache: rollout step h runs only the new
frame's tokens instead of re-running the predictor over the whole context.
"""
from __future__ import annotations

from mstar_compiler.catalogue import Dims, Family, KindSpec, Port


def _linear(c_in: int, c_out: int) -> int:
    return c_in * c_out + c_out


def _block_params(hidden: int, intermediate: int) -> int:
    """One pre-norm ViT block: 2 LayerNorms, q/k/v/proj (fused or not), a GELU MLP."""
    return 4 * hidden + 4 * _linear(hidden, hidden) + _linear(hidden, intermediate) + _linear(intermediate, hidden)


def encoder_params(d: Dims) -> int:
    """Exact parameter count of the runtime `vjepa2_encoder` module."""
    h, p = d["hidden_size"], d["patch_size"]
    patch_embed = h * d["in_chans"] * d["tubelet_size"] * p * p + h
    blocks = d["num_hidden_layers"] * _block_params(h, d["intermediate_size"])
    return patch_embed + blocks + 2 * h


def predictor_params(d: Dims) -> int:
    """Exact parameter count of the runtime `vjepa2_ac_predictor` module."""
    h, e, a = d["hidden_size"], d["embed_dim"], d["action_dim"]
    # predictor_embed, action/state encoders, and the (unused without extrinsics)
    # extrinsics_encoder that the published checkpoint carries
    inputs = _linear(e, h) + _linear(a, h) + _linear(d["state_dim"], h) + _linear(a - 1, h)
    blocks = d["num_hidden_layers"] * _block_params(h, d["intermediate_size"])
    return inputs + blocks + 2 * h + _linear(h, e)


def tokens_per_frame(d: Dims) -> int:
    """Patch tokens of one (tubelet) frame step: 256 at 256 px, patch 16."""
    return (d["image_size"] // d["patch_size"]) ** 2


def predictor_kv_bytes_per_token(d: Dims, dtype_bytes: int) -> int:
    """K and V of every layer for one token (patch or conditioning token)."""
    return d["num_hidden_layers"] * 2 * d["hidden_size"] * dtype_bytes


_VIDEO = {"in_chans": 3, "image_size": 256, "patch_size": 16, "tubelet_size": 2, "layer_norm_eps": 1e-6}

VJEPA2_ENCODER = KindSpec(
    kind="vjepa2_encoder",
    executor="vjepa2_encoder",
    doc="V-JEPA 2 video ViT: clip (F,3,H,W) -> hidden tokens per tubelet frame pair",
    inputs=(Port("video", "video", ("F", 3, "H", "W")),),
    outputs=(Port("hidden", "hidden", ("T", "hidden_size")),),
    presets={
        "tiny": {**_VIDEO, "image_size": 32, "patch_size": 8, "hidden_size": 48,
                 "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 96},
        # ViT-L/16 (transformers' VJEPA2Config defaults): the mid-size preset for benchmarks
        "vitl-256": {**_VIDEO, "hidden_size": 1024, "num_hidden_layers": 24,
                     "num_attention_heads": 16, "intermediate_size": 4096},
        # ViT-g/16, the encoder V-JEPA 2-AC was trained on
        "vitg-256": {**_VIDEO, "hidden_size": 1408, "num_hidden_layers": 40,
                     "num_attention_heads": 22, "intermediate_size": 6144},
    },
    num_params=encoder_params,
    can_batch=True,
    is_capture_safe=True,
    tp_divides=("num_attention_heads",),
    args={
        # layer-norm the output tokens without affine weights, as V-JEPA 2-AC's world
        # model does before the predictor ("normalize_reps")
        "normalize_reps": False,
    },
)

_AC = {"image_size": 256, "patch_size": 16, "tubelet_size": 2, "layer_norm_eps": 1e-6,
       "action_dim": 7, "state_dim": 7, "num_cond_tokens": 2}

VJEPA2_AC_PREDICTOR = KindSpec(
    kind="vjepa2_ac_predictor",
    executor="vjepa2_rollout",
    doc="V-JEPA 2-AC predictor: frame tokens + action/state -> next frame tokens, per-frame KV cache",
    inputs=(
        Port("frames", "hidden", ("T", "embed_dim")),       # context frame tokens (F x tokens_per_frame)
        Port("actions", "actions", ("F", "action_dim")),    # one action per frame step (context + rollout)
        Port("states", "actions", ("F", "state_dim")),      # end-effector state of the context frames
    ),
    outputs=(Port("prediction", "hidden", ("T", "embed_dim"), stream=True),),  # one frame per rollout step
    presets={
        "tiny": {**_AC, "image_size": 32, "patch_size": 8, "embed_dim": 48, "hidden_size": 32,
                 "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128},
        # reads vitl-256 tokens; enough compute per token to make O(H) vs O(H^2) show
        "ac-mid": {**_AC, "embed_dim": 1024, "hidden_size": 512, "num_hidden_layers": 8,
                   "num_attention_heads": 8, "intermediate_size": 2048},
        # the published V-JEPA 2-AC predictor, reading vitg-256 tokens
        "ac-24": {**_AC, "embed_dim": 1408, "hidden_size": 1024, "num_hidden_layers": 24,
                  "num_attention_heads": 16, "intermediate_size": 4096},
    },
    num_params=predictor_params,
    has_kv_cache=True,
    can_batch=True,
    is_capture_safe=False,  # the cached context grows by one frame per step
    kv_bytes_per_token=predictor_kv_bytes_per_token,
    tp_divides=("num_attention_heads",),
    args={
        "normalize_reps": True,   # layer-norm each predicted frame before it is fed back (native rollout)
        "state_update": "droid_pose",  # next state from (state, action): DROID pose integration, or "hold"
    },
)

KINDS: tuple[KindSpec, ...] = (VJEPA2_ENCODER, VJEPA2_AC_PREDICTOR)


# the family, declared once: its kinds, and the runtime that implements them (runtime/models/vjepa2/)
FAMILY = Family(
    "vjepa2", KINDS,
    components={
        "vjepa2_encoder": "runtime.models.vjepa2.vjepa2_encoder:Vjepa2Encoder",
        "vjepa2_ac_predictor": "runtime.models.vjepa2.vjepa2_ac_predictor:Vjepa2ACPredictor",
    },
    executors={
        "vjepa2_encoder": "runtime.models.vjepa2.executors:encoder_executor",
        "vjepa2_rollout": "runtime.models.vjepa2.executors:rollout_executor",
    },
    serving="runtime.models.vjepa2.serving:SERVING",
)
