"""BAGEL's upstream generation and understanding loops, in a process of its own: the `bagel-wide` suite's peer.

    PYTHONPATH=tools:. python -m bench.bagel_peer REPO DIMS_JSON [--threads N] [--dtype float32|bfloat16]

Reads REPO/ema.safetensors into the dense BAGEL LM restated from ByteDance-Seed/Bagel (bench.bagel_upstream_lm,
bench.bagel_upstream: three CFG contexts built input by input, a forward per CFG branch per step, nothing cached
across requests), the SigLIP tower into transformers' SiglipVisionModel (sdpa attention) fed BAGEL's packed patch
rows, and REPO/ae.safetensors into diffusers' AutoencoderKL through diffusers' own converter of the FLUX layout,
all in the files' dtype (bf16 at `bagel-wide`, as BAGEL runs) unless --dtype says. DIMS_JSON holds the plan's node dims and args
(`llm`, `vit`, `vae`, `cfg`), which the graph derives from the same llm_config.json and vit_config.json.

Prints one JSON line `{"ready": seconds, "threads": n, "dtype": "bfloat16"}`, then answers one JSON line per request read from stdin
until EOF, one request at a time (BAGEL's inferencer serves one):

  {"task": "t2i", "ids": [...], "width": W, "height": H, "seed": s, "steps": N, "cfg_text_scale": a,
   "timestep_shift": b}                                    -> {"wall": s, "png": base64}
  {"task": "i2i", "image": base64 PNG, ... as t2i, "cfg_img_scale": c}  -> the same
  {"task": "i2t", "jobs": [{"image": base64 PNG, "ids": [...]}, ...], "tokens": N}
                                                          -> {"wall": s, "e2e": [s, ...], "tokens": [[...], ...]}

Images are prepared as mstar's server and ranks prepare them (the same resize policies and normalisation, so
both sides compute on the same pixels); the noise is N(0, 1) of (C, H/8, W/8) from the seed, as mstar draws it.
"""
from __future__ import annotations

import argparse
import base64
import io
import json
import sys
import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from PIL import Image

from bench.bagel_upstream import Bagel, Context, Guidance
from bench.bagel_upstream_lm import siglip_twin


def _pictures(png: str, policies: list) -> list[torch.Tensor]:
    """The picture decoded once, resized by each policy in turn (as the server's VAE resize, then the ViT's),
    each stage's pixels in [-1, 1]."""
    from runtime.models.bagel.image_io import resize_for
    from runtime.model_executor.images import pil_to_tensor

    image, out = Image.open(io.BytesIO(base64.b64decode(png))).convert("RGB"), []
    for policy in policies:
        image = resize_for(image, policy)
        out.append(pil_to_tensor(image))
    return out


class UpstreamBagel:
    """The repository's weights in BAGEL's loops: `generate` (T2I, I2I) and `understand` (I2T), one request at a time."""

    def __init__(self, repo: str, dims: dict, dtype: torch.dtype | None) -> None:
        from safetensors.torch import load_file

        from bench.bagel_layout import reference_vae
        from runtime.models.bagel.generation import vae_resize, vit_resize

        ema = load_file(f"{repo}/ema.safetensors")
        if dtype is not None:
            ema = {k: v.to(dtype) for k, v in ema.items()}
        self.dtype = ema["language_model.model.embed_tokens.weight"].dtype
        self.d, self.vit_d, self.cfg = dims["llm"], dims["vit"], dims["cfg"]
        self.bagel = Bagel(ema, self.d)
        vit_state = {k: v for k, v in ema.items() if k.startswith(("vit_model.", "connector.", "vit_pos_embed."))}
        self.vit_state = vit_state
        self.vit = siglip_twin({k: v.float() for k, v in vit_state.items()}, self.vit_d, attn="sdpa").to(self.dtype)
        vae = SimpleNamespace(dims=dims["vae"]["dims"], args=dims["vae"]["args"])
        self.vae_args = vae.args
        self.vae = reference_vae(load_file(f"{repo}/ae.safetensors"), vae).to(self.dtype)
        self.vae_policy, self.vit_policy = vae_resize(self.d), vit_resize(self.vit_d)

    def vit_rows(self, pixels: torch.Tensor) -> torch.Tensor:
        """BAGEL's ViT rows of one image (3, h, w): patch rows (p x p x C each) through the patch embedding, SigLIP's
        learned positions at each patch's (row * side + col) id, the tower, the connector, the checkpoint's 2-D sin-cos
        table `vit_pos_embed` at the same ids."""
        p, side, W = self.vit_d["patch_size"], self.vit_d["max_num_patch_per_side"], self.vit_state
        c, h, w = pixels.shape
        patches = torch.einsum("chpwq->hwpqc", pixels.reshape(c, h // p, p, w // p, p)).reshape(-1, p * p * c)
        ids = (torch.arange(h // p)[:, None] * side + torch.arange(w // p)).flatten()
        emb = "vit_model.vision_model.embeddings."
        rows = F.linear(patches.to(self.dtype), W[f"{emb}patch_embedding.weight"], W[f"{emb}patch_embedding.bias"])
        rows = rows + W[f"{emb}position_embedding.weight"][ids]
        tower = self.vit                          # transformers 5: SiglipVisionModel is the tower itself
        hidden = tower.post_layernorm(tower.encoder(inputs_embeds=rows[None]).last_hidden_state)[0]
        hidden = F.gelu(F.linear(hidden, W["connector.fc1.weight"], W["connector.fc1.bias"]), approximate="tanh")
        rows = F.linear(hidden, W["connector.fc2.weight"], W["connector.fc2.bias"])
        return rows + W["vit_pos_embed.pos_embed"][ids]

    def vae_latent(self, pixels: torch.Tensor) -> torch.Tensor:
        mean = self.vae.encode(pixels[None].to(self.dtype)).latent_dist.mean[0].float()
        return self.vae_args["scaling_factor"] * (mean - self.vae_args["shift_factor"])

    def png(self, latent: torch.Tensor) -> str:
        """The latent decoded, as a PNG the way mstar's server writes one (the same rounding)."""
        from runtime.model_executor.images import png_bytes

        a = self.vae_args
        image = self.vae.decode((latent[None] / a["scaling_factor"] + a["shift_factor"]).to(self.dtype)).sample[0]
        return base64.b64encode(png_bytes(image)).decode()

    def generate(self, spec: dict) -> dict:
        start = time.perf_counter()
        inputs: list = []
        if spec["task"] == "i2i":
            pixels, vit_pixels = _pictures(spec["image"], [self.vae_policy, self.vit_policy])
            inputs.append((self.vae_latent(pixels), self.vit_rows(vit_pixels)))
            height, width = pixels.shape[1:]
            img_scale = float(spec["cfg_img_scale"])
        else:
            height, width, img_scale = spec["height"], spec["width"], 1.0     # T2I: no image branch
        inputs.append(list(spec["ids"]))
        g = torch.Generator().manual_seed(int(spec["seed"]))
        noise = torch.randn(self.d["latent_channels"], height // 8, width // 8, generator=g)
        guidance = Guidance(float(spec["cfg_text_scale"]), img_scale, tuple(self.cfg["cfg_interval"]),
                            self.cfg["renorm_type"], self.cfg["renorm_min"])
        latent = self.bagel.generate_image(self.bagel.interleave_inference(inputs), noise, int(spec["steps"]),
                                           float(spec["timestep_shift"]), guidance)
        png = self.png(latent)
        return {"wall": time.perf_counter() - start, "png": png}

    def understand(self, spec: dict) -> dict:
        start, e2e, tokens = time.perf_counter(), [], []
        for job in spec["jobs"]:
            rows = self.vit_rows(_pictures(job["image"], [self.vae_policy, self.vit_policy])[-1])
            ctx = self.bagel.update_context_vit(Context(), rows)
            ctx = self.bagel.update_context_text(ctx, list(job["ids"]))
            tokens.append(self.bagel.gen_text(ctx, int(spec["tokens"])))
            e2e.append(time.perf_counter() - start)
        return {"wall": time.perf_counter() - start, "e2e": e2e, "tokens": tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("repo")
    ap.add_argument("dims")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], help="compute in this dtype (default: the files')")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    with torch.inference_mode():
        dtype = getattr(torch, args.dtype) if args.dtype else None
        model = UpstreamBagel(args.repo, json.loads(open(args.dims).read()), dtype)
        print(json.dumps({"ready": time.perf_counter() - start, "threads": torch.get_num_threads(),
                          "dtype": str(model.dtype).removeprefix("torch.")}), flush=True)
        for line in sys.stdin:
            spec = json.loads(line)
            out = model.understand(spec) if spec["task"] == "i2t" else model.generate(spec)
            print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
