"""One set of BAGEL weights both sides of the `bagel-wide` suite serve, written once under .bench/bagel-wide/.

graphs/bagel.yaml's `bagel-wide` preset is BAGEL-7B-MoT at its published widths with 8 of the LM's 28 MoT layers,
the whole SigLIP so400m ViT and the whole FLUX VAE. No checkpoint can be downloaded here, and random weights at
the published shapes stream and multiply as the real ones do, so the suite writes the repository as
ByteDance-Seed/BAGEL-7B-MoT lays it out, at the plan's layer count:

  .bench/bagel-wide/BAGEL-7B-MoT/   ema.safetensors (the ViT, connector and MoT LM under their published names),
                                    ae.safetensors (the FLUX autoencoder in its original layout), llm_config.json
                                    and vit_config.json (bench.bagel_layout), a tokenizer; mstar-run reads it with
                                    --weights .bench/bagel-wide, the upstream loop (bench.bagel_peer) reads the
                                    same files

The tensors' names and shapes are the plan's nodes' checkpoint slots (built on the meta device, the names the
graph's mappings read) and diffusers' AutoencoderKL renamed to the FLUX layout; `mstar-run` checks every one at
start-up. Values are seeded normal (std 0.02; norm weights 1; `latent_pos_embed` and `vit_pos_embed` BAGEL's fixed
sin-cos tables, as published). ema.safetensors is written tensor by tensor (its
10 GB are never held in memory at once). The tokenizer is a word-level one over Qwen's ids
(bench.omni_wide_weights.write_qwen_tokenizer: BAGEL's bos / eos / image markers at Qwen2.5's special ids).
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from bench.registry import Context

REPOSITORY = "BAGEL-7B-MoT"
SEED = 2718
RECIPE = "3: seeded normal std 0.02, norms 1, the two position tables BAGEL's sin-cos ones"   # a repository of another recipe or shapes is rewritten
_BF16 = 2
ONES, NORMAL, SINCOS = "ones", "normal", "sincos"
POS_EMBED, VIT_POS_EMBED = "latent_pos_embed.pos_embed", "vit_pos_embed.pos_embed"   # BAGEL's fixed sin-cos tables


@dataclass(frozen=True)
class BagelWide:
    root: Path          # --weights ROOT for mstar-run
    repo: Path          # the repository directory the upstream loop reads


def plan_nodes(plan: Path) -> dict[str, Any]:
    from mstar_compiler.plan import load_plan

    return {n.name: n for n in load_plan(plan).nodes}


def ensure(ctx: Context, plan: Path, words: list[str], name: str = "bagel-wide") -> BagelWide:
    """The suite's repository for `plan`: the tensors written now if missing or of another recipe or shapes (about
    a minute and 11 GB on disk at `bagel-wide`), the configs and the tokenizer every time."""
    from bench.bagel_layout import write_bagel_configs
    from bench.omni_wide_weights import write_qwen_tokenizer

    root = ctx.bench_dir / name
    files = BagelWide(root, root / REPOSITORY)
    files.repo.mkdir(parents=True, exist_ok=True)
    nodes = plan_nodes(plan)
    llm = nodes["llm"].dims
    write_qwen_tokenizer(files.repo, sorted(set(words)), int(llm["vocab_size"]))
    write_bagel_configs(files.repo, llm, nodes["vit"].dims)
    ema, ae = ema_shapes(nodes), ae_shapes(nodes)
    wanted = {"recipe": RECIPE, "ema": ema, "ae": ae}
    stamp = files.repo / "mstar-bench-recipe.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == json.loads(json.dumps(wanted)):
        return files
    stamp.unlink(missing_ok=True)
    for old in [*files.repo.glob("*.safetensors"), *files.repo.glob("*.partial")]:
        old.unlink()                              # first: two copies of 10 GB may not fit the disk
    for file, shapes, offset in (("ema.safetensors", ema, 0), ("ae.safetensors", ae, len(ema))):
        write_streamed(files.repo / file, shapes, offset)
    stamp.write_text(json.dumps(wanted))          # last: a repository cut short is rewritten next time
    return files


def ema_shapes(nodes: dict[str, Any]) -> dict[str, list]:
    """{name: [shape, fill]} of ema.safetensors: the LM's and the ViT's checkpoint slots, and the LM's fixed 2-D
    sin-cos table `latent_pos_embed.pos_embed` that BAGEL stores and mstar rebuilds (the mapping's `optional`); the
    ViT's `vit_pos_embed.pos_embed` is BAGEL's fixed sin-cos table too."""
    from runtime.worker.loader import meta_slots

    out: dict[str, list] = {}
    for node in ("llm", "vit"):
        out.update({k: [list(s.shape), ONES if s.is_norm else NORMAL] for k, s in meta_slots(nodes[node]).items()})
    llm = nodes["llm"].dims
    out[POS_EMBED] = [[llm["max_latent_size"] ** 2, llm["hidden_size"]], SINCOS]
    out[VIT_POS_EMBED][1] = SINCOS
    return dict(sorted(out.items()))


def ae_shapes(nodes: dict[str, Any]) -> dict[str, list]:
    """{name: [shape, is_norm]} of ae.safetensors: diffusers' AutoencoderKL at the decoder's dims, in FLUX's names."""
    import torch

    from bench.bagel_layout import diffusers_vae, flux_layout

    vae = nodes["vae_dec"]
    with torch.device("meta"):
        state = diffusers_vae(vae.dims, vae.args).state_dict()
    flux = flux_layout(state, len(vae.dims["block_out_channels"]))
    return {k: [list(t.shape), ONES if ".norm" in k and k.endswith(".weight") else NORMAL]
            for k, t in sorted(flux.items())}


def _tensors(shapes: dict[str, list], offset: int) -> Iterator[tuple[str, Any]]:
    import torch

    from bench.bagel_upstream_lm import bagel_sincos_table

    for i, (name, (shape, fill)) in enumerate(shapes.items()):
        if fill == ONES:
            yield name, torch.ones(shape, dtype=torch.bfloat16)
        elif fill == SINCOS:
            yield name, bagel_sincos_table(shape[1], math.isqrt(shape[0])).to(torch.bfloat16)
        else:
            g = torch.Generator().manual_seed(SEED * 1_000_003 + offset + i)
            yield name, torch.randn(shape, generator=g).mul_(0.02).to(torch.bfloat16)


def write_streamed(path: Path, shapes: dict[str, list], offset: int) -> None:
    """A bf16 safetensors file written one tensor at a time: the header from the shapes, then each tensor's bytes."""
    import torch

    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    start = 0
    for name, (shape, _) in shapes.items():
        size = _BF16 * math.prod(shape)
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [start, start + size]}
        start += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    partial = path.with_suffix(".partial")
    with partial.open("wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for _, tensor in _tensors(shapes, offset):
            f.write(tensor.view(torch.int16).numpy().tobytes())
    partial.rename(path)
