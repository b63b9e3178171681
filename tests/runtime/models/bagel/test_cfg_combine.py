"""`cfg_combine`: per-request settings, mixed shapes and branch sets in one batch."""
from __future__ import annotations

import pytest
import torch

from mstar_compiler.catalogue import load_catalogue
from runtime.model_executor.components import component_class
from runtime.models.bagel.cfg_combine import CfgRequest
from runtime.models.bagel.cfg_kernel import Guidance, cfg_euler_step

SPEC = load_catalogue()["cfg_combine"]


def _node(**args):
    return component_class("cfg_combine")(SPEC.presets["tiny"], {**SPEC.args, **args})


TEXT_SCALE, IMG_SCALE = 4.0, 1.5     # BAGEL's defaults (graphs/bagel.yaml), the scales most requests bring


def _request(shape, seed, branches=2, **overrides) -> CfgRequest:
    g = torch.Generator().manual_seed(seed)
    x, vf, vt, vi = (torch.randn(*shape, generator=g) for _ in range(4))
    scales = {"text_scale": TEXT_SCALE, "img_scale": IMG_SCALE, **overrides}
    return CfgRequest(x, vf, vt if branches >= 1 else None, vi if branches >= 2 else None,
                      timestep=0.8, timestep_next=0.7, **scales)


def _one(v: torch.Tensor | None) -> torch.Tensor | None:
    return None if v is None else v[None]


def _alone(node, r: CfgRequest) -> torch.Tensor:
    g = Guidance.uniform(1, r.text_scale, r.img_scale, r.cfg_interval or node.cfg_interval)
    return cfg_euler_step(r.latent[None], r.v_full[None], _one(r.v_text), _one(r.v_img), torch.tensor([r.timestep]),
                          torch.tensor([r.timestep_next]), g, renorm_type=node.renorm_type,
                          renorm_min=node.renorm_min, backend="torch")[0]


@pytest.mark.parametrize("renorm_type", ["global", "channel", "text_channel"])
def test_batch_equals_members_with_request_overrides(renorm_type):
    node = _node(renorm_type=renorm_type, renorm_min=0.2)
    requests = [_request((16, 4, 4), 0), _request((16, 4, 6), 1, text_scale=2.5),
                _request((16, 4, 4), 2, branches=1), _request((16, 4, 4), 3, img_scale=3.0),
                _request((16, 4, 4), 4, cfg_interval=(0.0, 0.5)), _request((16, 4, 4), 5, branches=0)]
    out = node(requests)
    for r, x_next in zip(requests, out):
        assert x_next.shape == r.latent.shape
        # element-wise fp32 with one norm (a sum over a request's channels) each: a batch changes no element's
        # arithmetic, only how a norm's sum may be vectorised; measured exact, an ulp or two (eps 1.2e-7) allowed
        torch.testing.assert_close(x_next, _alone(node, r), rtol=1e-6, atol=1e-6)
    # outside its interval request 4 takes a plain Euler step with v_full
    # x - v * (t - t_next) with t - t_next = 0.8 - 0.7 in fp32, not 0.1: an ulp of the step's rounding; measured
    # max 1.2e-7 at |x| <= 3
    torch.testing.assert_close(out[4], requests[4].latent - requests[4].v_full * 0.1, rtol=1e-5, atol=1e-6)
    # guidance moves request 0 by up to 0.35 (measured) from the plain step: no rounding hides that from the default
    # 1e-5 relative
    assert not torch.allclose(out[0], requests[0].latent - requests[0].v_full * 0.1)


def test_rejects_unknown_renorm_type():
    with pytest.raises(ValueError, match="renorm_type"):
        _node(renorm_type="spatial")
