"""Z-Image-Turbo as diffusers and transformers run it, on random weights at any preset's dims: the parity
tests' oracle and the `dit` bench suite's peer.

`Reference(dims)` builds transformers' `Qwen3Model` (the text encoder), diffusers'
`ZImageTransformer2DModel`, `AutoencoderKL` (FLUX's layout) and `FlowMatchEulerDiscreteScheduler` as
Z-Image-Turbo's scheduler config sets it (shift 3, no dynamic shifting), seeded; `write_repository(root)`
saves them in the published repository's layout (text_encoder/, transformer/ and their shard indexes,
vae/, tokenizer/, model_index.json); `images(...)` runs diffusers' `ZImagePipeline` from the prompt's
token ids (the caption rows computed by the text encoder as the pipeline computes them: hidden_states[-2]
of the ids, then handed to it as `prompt_embeds`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer

from bench.bagel_layout import diffusers_vae
from bench.byte_tokenizer import write_byte_tokenizer

TEMPLATE = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"   # Qwen3's chat template, one user turn
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VAE_ARGS = {"scaling_factor": 0.3611, "shift_factor": 0.1159}


def _encoder(d: Mapping[str, Any]) -> Any:
    from transformers import Qwen3Config, Qwen3Model
    config = Qwen3Config(
        vocab_size=d["vocab_size"], hidden_size=d["hidden_size"], intermediate_size=d["intermediate_size"],
        num_hidden_layers=d["num_hidden_layers"], num_attention_heads=d["num_attention_heads"],
        num_key_value_heads=d["num_key_value_heads"], head_dim=d["head_dim"], rms_norm_eps=d["rms_norm_eps"],
        rope_theta=d["rope_theta"], tie_word_embeddings=True, max_position_embeddings=40960)
    return Qwen3Model(config).eval()


def _dit(d: Mapping[str, Any], scale: float) -> Any:
    from diffusers import ZImageTransformer2DModel
    model = ZImageTransformer2DModel(
        all_patch_size=(2,), all_f_patch_size=(1,), in_channels=d["in_channels"], dim=d["dim"],
        n_layers=d["n_layers"], n_refiner_layers=d["n_refiner_layers"], n_heads=d["n_heads"], n_kv_heads=d["n_heads"],
        norm_eps=d["norm_eps"], qk_norm=True, cap_feat_dim=d["cap_feat_dim"], rope_theta=d["rope_theta"],
        t_scale=d["t_scale"], axes_dims=d["axes_dims"], axes_lens=d["axes_lens"]).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():   # upstream starts the adaLN and output layers at zero: draw everything
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale)
    return model


class Reference:
    """The upstream pipeline's parts at `dims` ({"text_enc": ..., "dit": ..., "vae_dec": ...}), seeded."""

    def __init__(self, dims: Mapping[str, Mapping[str, Any]], dtype: torch.dtype = torch.float32,
                 dit_scale: float = 0.2) -> None:
        from diffusers import FlowMatchEulerDiscreteScheduler
        torch.manual_seed(0)
        self.encoder = _encoder(dims["text_enc"]).to(dtype)
        self.dit = _dit(dims["dit"], dit_scale).to(dtype)
        self.vae = diffusers_vae(dict(dims["vae_dec"]), VAE_ARGS).to(dtype)
        self.scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0,
                                                         use_dynamic_shifting=False)
        self.tokenizer: Tokenizer | None = None

    def write_repository(self, root: Path) -> Path:
        """root/Z-Image-Turbo/ in the published layout; returns it."""
        repo = root / "Z-Image-Turbo"
        self.tokenizer = write_byte_tokenizer(repo / "tokenizer", SPECIALS)
        _save_sharded(repo / "text_encoder", "model", self.encoder.state_dict(), self.encoder.config.to_dict())
        _save_sharded(repo / "transformer", "diffusion_pytorch_model", self.dit.state_dict(), dict(self.dit.config))
        (repo / "vae").mkdir(parents=True)
        save_file(_contiguous(self.vae.state_dict()), str(repo / "vae" / "diffusion_pytorch_model.safetensors"))
        (repo / "vae" / "config.json").write_text(json.dumps(dict(self.vae.config), default=list))
        (repo / "scheduler").mkdir()
        (repo / "scheduler" / "scheduler_config.json").write_text(json.dumps(dict(self.scheduler.config)))
        (repo / "model_index.json").write_text(json.dumps({"_class_name": "ZImagePipeline"}))
        return repo

    def prompt_ids(self, prompt: str) -> list[int]:
        assert self.tokenizer is not None, "write_repository first"
        return self.tokenizer.encode(TEMPLATE.format(prompt), add_special_tokens=False).ids

    @torch.inference_mode()
    def caption_rows(self, prompts: list[list[int]], padded_to: int | None = None) -> list[torch.Tensor]:
        """Each prompt's hidden_states[-2] rows; `padded_to`: as the pipeline encodes, every prompt padded to
        that many tokens (its max_sequence_length, 512) under an attention mask, in one call."""
        if padded_to is None:
            return [self.encoder(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states[-2][0]
                    for ids in prompts]
        ids = torch.zeros(len(prompts), padded_to, dtype=torch.long)
        mask = torch.zeros(len(prompts), padded_to, dtype=torch.bool)
        for b, p in enumerate(prompts):
            ids[b, :len(p)], mask[b, :len(p)] = torch.tensor(p), True
        hidden = self.encoder(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[-2]
        return [hidden[b][mask[b]] for b in range(len(prompts))]

    @torch.inference_mode()
    def images(self, prompts: list[list[int]], seeds: list[int], width: int, height: int, steps: int,
               padded_to: int | None = None, batched: bool = False) -> list[np.ndarray]:
        """(H, W, 3) uint8 per prompt: one pipeline call per request (each its own generator), or with `batched`
        one call for all (the pipeline's own batching: a generator per image)."""
        from diffusers import ZImagePipeline
        pipe = ZImagePipeline(scheduler=self.scheduler, vae=self.vae, text_encoder=self.encoder, tokenizer=None,
                              transformer=self.dit)
        pipe.set_progress_bar_config(disable=True)
        rows = self.caption_rows(prompts, padded_to)
        calls = [(rows, seeds)] if batched else [([r], [s]) for r, s in zip(rows, seeds)]
        out = []
        for embeds, call_seeds in calls:
            images = pipe(prompt_embeds=embeds, guidance_scale=0.0, num_inference_steps=steps, height=height,
                          width=width, generator=[torch.Generator().manual_seed(s) for s in call_seeds],
                          output_type="np").images
            out += [(image * 255).round().astype(np.uint8) for image in images]
        return out


def _contiguous(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.contiguous() for k, v in state.items()}


def _save_sharded(folder: Path, stem: str, state: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> None:
    """Two shards and their index, as a published multi-file checkpoint."""
    folder.mkdir(parents=True)
    names = sorted(state)
    halves = (names[:len(names) // 2], names[len(names) // 2:])
    weight_map = {}
    for i, part in enumerate(halves, 1):
        file = f"{stem}-0000{i}-of-00002.safetensors"
        save_file(_contiguous({n: state[n] for n in part}), str(folder / file))
        weight_map.update({n: file for n in part})
    (folder / f"{stem}.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(config, default=_jsonable))


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, (tuple, set)) else str(value)
