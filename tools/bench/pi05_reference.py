"""π0.5 as transformers runs it, on random weights at any preset's dims: the parity tests' oracle and the `pi05`
bench suite's peer.

`model(dims)` builds transformers' `PI05ForConditionalGeneration` (PaliGemma with a SigLIP tower, the Gemma
action expert) at the flattened dims of mstar_compiler/catalogue/pi05.py, seeded, every parameter drawn
(upstream starts the expert's adaptive norms at zero, which would hide them); `published_state(model)` is its
state dict under the names lerobot publishes (`paligemma_with_expert.paligemma.model.*`, its `lm_head` in place
of the token table, `paligemma_with_expert.gemma_expert.model.*`, `action_in_proj`, `time_mlp_*`, ...), the
inverse of transformers' own conversion mapping for pi0 checkpoints; `prompt_ids(...)` builds the prompt as
`PI05Processor.build_prompts` writes it; `sample(...)` runs `sample_actions` with given noise.
"""
from __future__ import annotations

import re
from typing import Any, Mapping

import torch

BINS = 256              # PI05Processor discretises the normalised state into 256 bins over [-1, 1]


def config(d: Mapping[str, Any]) -> Any:
    from transformers import PI05Config
    text = {"model_type": "gemma", "hidden_size": d["hidden_size"], "num_hidden_layers": d["num_hidden_layers"],
            "intermediate_size": d["intermediate_size"], "num_attention_heads": d["num_attention_heads"],
            "num_key_value_heads": d["num_key_value_heads"], "head_dim": d["head_dim"], "vocab_size": d["vocab_size"],
            "rms_norm_eps": d["rms_norm_eps"], "rope_theta": d["rope_theta"]}
    vision = {"model_type": "siglip_vision_model", "hidden_size": d["vision_hidden_size"],
              "intermediate_size": d["vision_intermediate_size"], "patch_size": d["patch_size"],
              "image_size": d["image_size"], "num_hidden_layers": d["vision_num_hidden_layers"],
              "num_attention_heads": d["vision_num_attention_heads"], "vision_use_head": False,
              "layer_norm_eps": d["layer_norm_eps"]}
    dit = {"model_type": "gemma", "hidden_size": d["expert_hidden_size"], "num_hidden_layers": d["num_hidden_layers"],
           "intermediate_size": d["expert_intermediate_size"], "num_attention_heads": d["expert_num_attention_heads"],
           "num_key_value_heads": d["num_key_value_heads"], "head_dim": d["head_dim"],
           "rms_norm_eps": d["rms_norm_eps"], "rope_theta": d["rope_theta"]}
    return PI05Config(vlm_config={"model_type": "paligemma", "text_config": text, "vision_config": vision,
                                  "projection_dim": d["hidden_size"], "image_token_id": d["image_token_id"]},
                      dit_config=dit, chunk_size=d["chunk_size"], max_action_dim=d["max_action_dim"],
                      min_period=d["min_period"], max_period=d["max_period"])


def model(d: Mapping[str, Any], seed: int = 0, scale: float = 0.05) -> Any:
    from transformers import PI05ForConditionalGeneration
    torch.manual_seed(seed)
    m = PI05ForConditionalGeneration(config(d)).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("norm.weight") or "layer_norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g) if "vision_tower" in name
                        else 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * scale)
    return m


def published_state(m: Any) -> dict[str, torch.Tensor]:
    """The model's tensors under lerobot's published names (the expert's unused lm_head left out)."""
    out = {}
    for name, t in m.state_dict().items():
        if name == "model.vlm.language_model.embed_tokens.weight":
            name = "paligemma_with_expert.paligemma.lm_head.weight"
        name = re.sub(r"^model\.vlm\.", "paligemma_with_expert.paligemma.model.", name)
        name = re.sub(r"^model\.dit\.", "paligemma_with_expert.gemma_expert.model.", name)
        name = re.sub(r"^embed_action_time\.", "", name)
        out[name] = t.contiguous()
    return out


def prompt_text(task: str, state: torch.Tensor) -> str:
    """PI05Processor.build_prompts' text after the image tokens and <bos>."""
    bins = torch.linspace(-1, 1, BINS + 1)[:-1]
    discrete = torch.bucketize(state.flatten(), bins, right=True) - 1
    task = task.strip().replace("_", " ").replace("\n", " ")
    return f"Task: {task}, State: {' '.join(map(str, discrete.tolist()))};\nAction: "


@torch.inference_mode()
def sample(m: Any, input_ids: torch.Tensor, pixel_values: torch.Tensor, camera_mask: torch.Tensor,
           noise: torch.Tensor, steps: int, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """transformers' `sample_actions` of a batch: (B, chunk, max_action_dim)."""
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    return m.sample_actions(input_ids=input_ids, pixel_values=pixel_values, noise=noise,
                            attention_mask=attention_mask, pixel_attention_mask=camera_mask, num_steps=steps)
