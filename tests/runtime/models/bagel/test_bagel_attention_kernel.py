"""BAGEL's own attention calls (the ViT's packed images, the LM's joint segments) run on torch's fused CPU SDPA
kernel, not its math fallback, which materialises every score matrix: the kernel is chosen by the call's shape
(4-D inputs only), so a reshaped call can silently fall back. Checked by the op torch.profiler records, and the
outputs against the math path's (docs/benchmark-log.md has what the fallback cost)."""
from __future__ import annotations

import torch
from torch.profiler import profile

from runtime.models.bagel.joint_attention import attend_segments
from runtime.models.bagel.segments import SegmentLayout
from runtime.models.bagel.siglip_vit import packed_attention

FUSED, MATH = "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_attention_math"


def _ops(fn) -> set[str]:
    with profile() as prof:
        fn()
    return {e.key for e in prof.key_averages()}


def _math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """(T, H, D) attention written out, the reference."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / q.shape[-1] ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def test_the_vits_packed_images_run_on_the_fused_kernel() -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(40, 4, 16, generator=g) for _ in range(3))
    ops = _ops(lambda: packed_attention(q, k, v, [24, 16]))
    assert FUSED in ops and MATH not in ops
    want = torch.cat([_math(q[:24], k[:24], v[:24]), _math(q[24:], k[24:], v[24:])])
    # fp32, softmax over <= 24 keys summed in another order (blocked online softmax vs einsum): a few ulps
    torch.testing.assert_close(packed_attention(q, k, v, [24, 16]), want, rtol=1e-5, atol=1e-5)


def test_the_lms_joint_segments_run_on_the_fused_kernel() -> None:
    """A block over 6 cached tokens (bidirectional) and a causal segment, grouped query heads (4 over 2)."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(12, heads, 16, generator=g) for heads in (4, 2, 2))
    k_cache, v_cache = torch.randn(4, 4, 2, 16, generator=g), torch.randn(4, 4, 2, 16, generator=g)
    slots = torch.tensor([0, 1, 2, 3, 4, 5])
    causal = torch.arange(6 + 4)[None] <= (torch.arange(4) + 6)[:, None]
    layout = SegmentLayout(starts=(0, 8), lengths=(8, 4), context_lens=(6, 6), context_slots=(slots, slots),
                           masks=(None, causal), write_rows=torch.tensor([], dtype=torch.long),
                           slot_mapping=torch.tensor([], dtype=torch.long), causal_metadata=None)
    ops = _ops(lambda: attend_segments(q, k, v, k_cache, v_cache, layout, 16 ** -0.5))
    assert FUSED in ops and MATH not in ops
    ctx_k, ctx_v = k_cache.view(-1, 2, 16)[slots], v_cache.view(-1, 2, 16)[slots]
    want = torch.cat([_math(q[:8], torch.cat([ctx_k, k[:8]]), torch.cat([ctx_v, v[:8]])),
                      _math(q[8:], torch.cat([ctx_k, k[8:]]), torch.cat([ctx_v, v[8:]]), causal)])
    # fp32, softmax over <= 14 keys summed in another order: a few ulps
    torch.testing.assert_close(attend_segments(q, k, v, k_cache, v_cache, layout, 16 ** -0.5), want,
                               rtol=1e-5, atol=1e-5)
