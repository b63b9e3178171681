"""Helpers of the compiler tests: a toy catalogue (independent of the family files),
repository paths and a compile shortcut that verifies the IR after every pass."""
from __future__ import annotations

from pathlib import Path

from mstar_compiler.catalogue import Catalogue, KindSpec, Port
from mstar_compiler.ir import Options
from mstar_compiler.pipeline import Compiled, compile_text


def _lm_params(d) -> int:
    h, v, n = d["hidden_size"], d["vocab_size"], d["num_layers"]
    return v * h + n * 12 * h * h


def _lm_kv(d, nbytes: int) -> int:
    return 2 * d["num_layers"] * d["num_kv_heads"] * d["head_dim"] * nbytes


TOY_LM = KindSpec(
    kind="toy_lm", doc="a toy decoder LM",
    inputs=(Port("tokens", "tokens", ("T",)), Port("embeds", "hidden", ("T", "hidden_size"), optional=True),
            Port("latent", "latent", (16, "H", "W"), optional=True)),
    outputs=(Port("token", "tokens", ("T",), stream=True), Port("hidden", "hidden", ("T", "hidden_size"))),
    presets={"tiny": {"hidden_size": 64, "vocab_size": 512, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
                      "head_dim": 16},
             "big": {"hidden_size": 4096, "vocab_size": 32000, "num_layers": 32, "num_heads": 32,
                     "num_kv_heads": 8, "head_dim": 128}},
    num_params=_lm_params, has_kv_cache=True, is_capture_safe=True, kv_bytes_per_token=_lm_kv,
    tp_divides=("num_heads", "num_kv_heads"), args={"temperature": 1.0},
)
TOY_VIT = KindSpec(
    kind="toy_vit", doc="a toy image encoder",
    inputs=(Port("image", "image", (3, "H", "W")),),
    outputs=(Port("embeds", "hidden", ("T", "out_dim")),),
    presets={"tiny": {"out_dim": 64, "width": 32}, "wide": {"out_dim": 128, "width": 32}},
    num_params=lambda d: d["out_dim"] * d["width"] * 10,
)
TOY_DENOISER = KindSpec(
    kind="toy_denoiser", doc="a toy velocity predictor",
    inputs=(Port("latent", "latent", ("channels", "H", "W")), Port("t", "scalar", (), optional=True)),
    outputs=(Port("velocity", "velocity", ("channels", "H", "W")),),
    presets={"tiny": {"channels": 16}}, num_params=lambda d: 1000, is_capture_safe=True,
)
TOY_CFG = KindSpec(
    kind="toy_cfg", doc="a toy CFG combine",
    inputs=(Port("cond", "velocity", ("channels", "H", "W")), Port("uncond", "velocity", ("channels", "H", "W")),
            Port("latent", "latent", ("channels", "H", "W"))),
    outputs=(Port("latent", "latent", ("channels", "H", "W")),),
    presets={"tiny": {"channels": 16}}, num_params=lambda d: 0, is_capture_safe=True, args={"scale": 4.0},
)
TOY_DECODER = KindSpec(
    kind="toy_decoder", doc="a toy latent decoder",
    inputs=(Port("latent", "latent", ("channels", "H", "W")),),
    outputs=(Port("image", "image", (3, "H", "W")),),
    presets={"tiny": {"channels": 16}, "wrong": {"channels": 8}}, num_params=lambda d: 5000,
)
TOY_VOCODER = KindSpec(
    kind="toy_vocoder", doc="a toy vocoder reading streamed tokens",
    inputs=(Port("codes", "tokens", ("T",), stream=True),),
    outputs=(Port("audio", "audio", ("S",)),),
    presets={"tiny": {"dim": 8}}, num_params=lambda d: 100, can_batch=False,
)


def toy_catalogue() -> Catalogue:
    return Catalogue([TOY_LM, TOY_VIT, TOY_DENOISER, TOY_CFG, TOY_DECODER, TOY_VOCODER])


HERE = Path(__file__).parent
REPO = HERE.parents[1]


def compile_toy(text: str, file: str = "g.yaml", **options) -> Compiled:
    """Compile YAML text against the toy catalogue, verifying the IR after every pass."""
    return compile_text(text, file, Options(**options), catalogue=toy_catalogue(), verify=True)
