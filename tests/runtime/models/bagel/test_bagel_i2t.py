"""BAGEL image understanding (I2T) through the executors the worker runs: the answer depends on
the image, and its logits equal BAGEL's context built by hand (transformers' SigLIP, the
connector and position table, then the LM reading <|vision_start|> ViT tokens <|vision_end|>
at one shared RoPE position, non-causally, before the text that follows at the next ones)."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from runtime.models.bagel.generation import vit_resize
from runtime.models.bagel.node_executors import image_tensor
from runtime.model_executor.sampling import Sampler
from runtime.transport.messages import WorkItem
from runtime.model_executor.weights.sources import WeightOptions
from tests.runtime.models.bagel.bagel_harness import Driver, rank_executors, tiny_plan
from tests.runtime.models.bagel.bagel_lm_helpers import RefSequence, bagel_weights
from bench.bagel_upstream_lm import DenseBagel, vit_context_rows

PROMPT = [5, 6, 7]
PARAMS = {"max_tokens": 4, "temperature": 0.0}


class LogitsSpy(Sampler):
    """The engine's real sampler, keeping the logits of every decode step it samples."""

    def __init__(self) -> None:
        super().__init__()
        self.logits: list[torch.Tensor] = []

    def __call__(self, logits, states):
        self.logits.append(logits.clone())
        return super().__call__(logits, states)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A rank's executors with seeded, noisy LM weights (a BAGEL-named file, as --weights llm=FILE
    gives it) and a logits spy."""
    plan = tiny_plan()
    weights = bagel_weights(plan.node("llm").dims, seed=4)
    path = tmp_path_factory.mktemp("bagel") / "llm.safetensors"
    save_file(weights, str(path))
    executors, modules = rank_executors(plan, options=WeightOptions((f"llm={path}",)))
    spy = LogitsSpy()
    executors["llm"].engine.sampler = spy
    return plan, executors, modules, weights, spy


def _answer_logits(served, rid: int, image: torch.Tensor) -> torch.Tensor:
    """The first answer step's logits of an I2T request (image, then the prompt), as the conductor
    drives it: read_image (vit -> llm), read_text, then answer from BAGEL's <|im_start|>."""
    _, executors, _, _, spy = served
    drv = Driver(served[0], executors)
    drv.open(rid, PARAMS)
    drv.group([("vit", [WorkItem(rid, walk="read_image")], [{"image": image}])])
    drv.group([("llm", [WorkItem(rid, walk="read_image")], [{"embeds": drv.value(rid, "vit.hidden")}])])
    drv.group([("llm", [WorkItem(rid, tokens=PROMPT, walk="read_text")], [{}])])
    drv.group([("llm", [WorkItem(rid, step=0, walk="answer")], [{}])])
    logits = spy.logits[-1][0]
    drv.close(rid)
    assert executors["llm"].engine.used_blocks("full") == 0 and drv.lms.pool.used_blocks == 0
    return logits


def _image(seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (56, 56, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def test_the_answer_depends_on_the_image(served) -> None:
    first, again, other = (_answer_logits(served, rid, _image(seed)) for rid, seed in ((1, 1), (2, 1), (3, 2)))
    assert torch.equal(first, again)      # same image, same calls: the same bits
    # tiny random weights move the logits by ~1e-3 per image; float rounding alone moves them ~1e-6
    assert (first - other).abs().max() > 1e-3


def test_i2t_logits_equal_bagel_context(served) -> None:
    plan, _, modules, weights, _ = served
    image = _image(3)
    got = _answer_logits(served, 4, image)
    vit_dims, lm_dims = plan.node("vit").dims, plan.node("llm").dims
    pixels = image_tensor(image, vit_resize(vit_dims))
    assert pixels.shape == (3, 56, 56)        # the full 4 x 4 grid: transformers' SigLIP takes it as is
    ref = RefSequence(DenseBagel(weights, lm_dims))
    ref.vit(vit_context_rows(modules["vit"].state_dict(), vit_dims, pixels))   # positions 0 (18 rows)
    assert ref.rope == 1
    ref.text(PROMPT)                                                          # positions 1..5
    want = ref.decode(lm_dims["bos_token_id"])
    # fp32 on both sides; SDPA vs einsum attention and fused vs split projections differ in rounding (a few ulps,
    # eps 1.2e-7, per layer on logits |l| <= 1.3): measured max 7.2e-7, 0.4% of the bound
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
