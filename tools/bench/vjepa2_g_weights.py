"""One set of V-JEPA 2-AC ViT-g weights both sides of the `vjepa2-g` suite run, written once under .bench/vjepa2-g/.

No checkpoint can be downloaded here; random weights at the published shapes cost what the real ones cost.
Meta's own code builds the model (its hub entry `vjepa2_ac_vit_giant(pretrained=False)`: the ViT-g/16 encoder
and the 24-layer AC predictor, with Meta's initialisation, seeded), and its state dicts are written as
facebookresearch/vjepa2's training script saves the published file (`module.` names under "encoder" and
"predictor"; the training state the loaders skip is left out):

  .bench/vjepa2-g/vjepa2/vjepa2-ac-vitg.pt           the published layout (a torch pickle, as published)
  .bench/vjepa2-g/vjepa2/vjepa2-ac-vitg.safetensors  `mstar-run convert-weights` of it: mstar-run reads it with
                                                     --weights, and Meta's modules are loaded from it too
"""
from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.registry import Context, Needs

SEED = 0
FILE = "vjepa2-ac-vitg"


@dataclass(frozen=True)
class VJepa2G:
    root: Path          # --weights ROOT for mstar-run

    @property
    def safetensors(self) -> Path:
        return self.root / "vjepa2" / f"{FILE}.safetensors"


def ensure(ctx: Context) -> VJepa2G:
    """The suite's weights, written now if they are not there (a few minutes, ~10 GB on disk)."""
    files = VJepa2G(ctx.bench_dir / "vjepa2-g")
    if not files.safetensors.is_file():
        _write(files)
    return files


def _write(files: VJepa2G) -> None:
    import torch

    from bench.vjepa2_meta import meta_ac_vitg

    torch.manual_seed(SEED)
    encoder, predictor = meta_ac_vitg()
    out = files.safetensors.parent
    out.mkdir(parents=True, exist_ok=True)
    torch.save({part: {f"module.{k}": v for k, v in module.state_dict().items()}
                for part, module in (("encoder", encoder), ("predictor", predictor))}, out / f"{FILE}.pt")
    del encoder, predictor
    mstar_run = Path(sys.executable).parent / "mstar-run"
    done = subprocess.run([str(mstar_run), "convert-weights", str(files.root)], capture_output=True, text=True)
    if done.returncode != 0 or not files.safetensors.is_file():
        raise Needs(f"`mstar-run convert-weights {files.root}` to write {files.safetensors}: "
                    f"{(done.stderr or done.stdout).strip()[-300:]}")


def load_meta(files: VJepa2G, dtype) -> tuple:
    """Meta's encoder and predictor holding the suite's weights (read from the converted file), in `dtype`."""
    import torch
    from safetensors import safe_open

    from bench.vjepa2_meta import meta_ac_vitg

    encoder, predictor = meta_ac_vitg()
    with safe_open(str(files.safetensors), framework="pt") as f, torch.no_grad():
        for part, module in (("encoder", encoder), ("predictor", predictor)):
            params, prefix = dict(module.state_dict()), f"{part}.module."
            names = {n[len(prefix):]: n for n in f.keys() if n.startswith(prefix)}
            if names.keys() != params.keys():
                raise Needs(f"{files.safetensors} to hold Meta's {part} state dict exactly")
            for name, stored in names.items():
                params[name].copy_(f.get_tensor(stored))
    return encoder.to(dtype), predictor.to(dtype)
