"""mstar's Z-Image denoiser against diffusers' `ZImageTransformer2DModel` on the same random tiny weights:
one request, and a batch of requests with different latent sizes, caption lengths and timesteps."""
from __future__ import annotations

import torch
from diffusers import ZImageTransformer2DModel

from mstar_compiler.catalogue.zimage import PRESETS
from runtime.models.zimage.zimage_dit import ZImageDiT

DIMS = PRESETS["tiny"]


def models() -> tuple[torch.nn.Module, ZImageDiT]:
    torch.manual_seed(0)
    ref = ZImageTransformer2DModel(
        all_patch_size=(2,), all_f_patch_size=(1,), in_channels=DIMS["in_channels"], dim=DIMS["dim"],
        n_layers=DIMS["n_layers"], n_refiner_layers=DIMS["n_refiner_layers"], n_heads=DIMS["n_heads"],
        n_kv_heads=DIMS["n_heads"], norm_eps=DIMS["norm_eps"], qk_norm=True, cap_feat_dim=DIMS["cap_feat_dim"],
        rope_theta=DIMS["rope_theta"], t_scale=DIMS["t_scale"], axes_dims=DIMS["axes_dims"],
        axes_lens=DIMS["axes_lens"]).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():       # the adaLN and output layers start at zero upstream: draw everything
        for p in ref.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    mine = ZImageDiT(DIMS).eval()
    mine.load_state_dict(ref.state_dict())
    return ref, mine


@torch.inference_mode()
def test_one_step_of_a_batch_equals_diffusers_per_request() -> None:
    ref, mine = models()
    assert sum(p.numel() for p in mine.parameters()) == sum(p.numel() for p in ref.parameters())
    g = torch.Generator().manual_seed(2)
    channels = DIMS["in_channels"]
    latents = [torch.randn(channels, 8, 8, generator=g), torch.randn(channels, 12, 16, generator=g)]
    caps = [torch.randn(5, DIMS["cap_feat_dim"], generator=g), torch.randn(40, DIMS["cap_feat_dim"], generator=g)]
    t = torch.tensor([0.9, 0.25])
    got = mine(latents, t, caps)
    for b in range(2):
        want = ref([latents[b].unsqueeze(1)], t[b:b + 1], [caps[b]], return_dict=False)[0][0].squeeze(1)
        # fp32, 4 blocks of width 64: only the reduction order differs (batched and padded vs alone)
        torch.testing.assert_close(got[b], want, atol=1e-4, rtol=1e-4)
    both = ref([x.unsqueeze(1) for x in latents], t, caps, return_dict=False)[0]
    # both sides batched and padded, in their own order of reductions (fp32 reassociation)
    torch.testing.assert_close(got[1], both[1].squeeze(1), atol=1e-4, rtol=1e-4)
