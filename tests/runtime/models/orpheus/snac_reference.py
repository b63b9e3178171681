"""Factories shared by the Orpheus tests: the tiny `snac_decoder` and its `snac` twin."""
from __future__ import annotations

import torch
from snac import SNAC
from snac.layers import NoiseBlock

from mstar_compiler.catalogue import load_catalogue
from runtime.model_executor.components import component_class

OFFSET, CODEBOOK = 128266, 4096


def tiny_dims() -> dict:
    return dict(load_catalogue()["snac_decoder"].presets["tiny"])


def make_decoder(seed: int = 0, **args) -> torch.nn.Module:
    spec = load_catalogue()["snac_decoder"]
    torch.manual_seed(seed)
    return component_class("snac_decoder")(tiny_dims(), {**spec.args, **args}).eval()


def reference_snac(decoder: torch.nn.Module, silent_noise: bool) -> SNAC:
    """The `snac` package's own model (published structure, noise on) with the same weights.

    With `silent_noise`, each NoiseBlock's weight-norm gain is zeroed, so the block adds
    0 * noise: the reference's meaning of "no noise" without touching its code.
    """
    d = tiny_dims()
    ref = SNAC(latent_dim=d["latent_dim"], encoder_dim=4, encoder_rates=[2, 2], decoder_dim=d["decoder_dim"],
               decoder_rates=list(d["decoder_rates"]), attn_window_size=None, codebook_size=d["codebook_size"],
               codebook_dim=d["codebook_dim"], vq_strides=list(d["vq_strides"]), noise=True).eval()
    result = ref.load_state_dict(decoder.state_dict(), strict=False)
    assert not result.unexpected_keys
    assert all(k.startswith("encoder.") for k in result.missing_keys)
    if silent_noise:
        for module in ref.decoder.modules():
            if isinstance(module, NoiseBlock):
                module.linear.parametrizations.weight.original0.data.zero_()
    return ref


def random_levels(num_frames: int, batch: int = 1, seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, CODEBOOK, (batch, num_frames * k), generator=g) for k in (1, 2, 4)]
