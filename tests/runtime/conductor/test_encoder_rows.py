"""An encoder's rows count against a batch's rows as an LM's new tokens do (SchedulerConfig.max_batch_tokens):
pictures and utterances are cut into calls that the memory plan's activation share can hold, not run all at
once. Driven by workers that speak the real messages (runtime/conductor/null_workers.py) on the Qwen3-Omni tiny
plan, whose audio parts are `MediaInput` items (an encoder reads the waveform, the thinker its placeholders)."""
from __future__ import annotations

import asyncio

import torch

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.conductor.conductor import Conductor
from runtime.conductor.config import ConductorConfig
from runtime.conductor.null_workers import NullWorkers
from runtime.conductor.request import MediaInput
from runtime.conductor.scheduler import SchedulerConfig
from runtime.transport.messages import RunBatch
from runtime.transport.request_params import RequestParams
from tests.runtime.serving.conftest import REPO

ROWS, REQUESTS, PAD = 40, 6, 151646


class RecordingWorkers(NullWorkers):
    def __init__(self, conductor: Conductor) -> None:
        super().__init__(conductor)
        self.sent: list[RunBatch] = []

    def send(self, rank: int, msg, tensors: dict | None = None) -> None:
        if isinstance(msg, RunBatch) and not msg.follower:
            self.sent.append(msg)
        super().send(rank, msg, tensors)


def encoder_batches(max_batch_tokens: int) -> list[int]:
    """Items per audio-encoder batch when REQUESTS chats with one utterance of ROWS rows each arrive at once."""
    plan = compile_file(str(REPO / "graphs" / "qwen3_omni.yaml"), Options(preset="tiny")).plan
    conductor = Conductor(plan, ConductorConfig(plan_path="plan.bin",
                                                scheduler=SchedulerConfig(max_batch_tokens=max_batch_tokens)))
    workers = RecordingWorkers(conductor)
    reqs = [conductor.submit("chat", RequestParams(declared={"max_tokens": 2}),
                             [("text", [1, 2, 3]), ("audio", MediaInput(torch.zeros(16000), [PAD] * ROWS)),
                              ("text", [4, 5])]) for _ in range(REQUESTS)]

    async def drive() -> None:
        for _ in range(200):
            if all(r.state.is_final for r in reqs):
                return
            await conductor.step()
        raise AssertionError("the requests did not end in 200 steps")
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(drive())
    finally:
        loop.close()
    assert all(r.finish_reason != "error" for r in reqs)
    return [len(b.items) for b in workers.sent if b.node == "audio_enc"]


def test_an_encoders_rows_fill_a_batch_as_an_lms_tokens_do() -> None:
    assert encoder_batches(4096) == [REQUESTS]                   # 240 rows: one call, as before
    assert encoder_batches(2 * ROWS + 10) == [2, 2, 2]           # two utterances a call
    assert encoder_batches(ROWS) == [1] * REQUESTS               # one fills it
    assert encoder_batches(ROWS // 2) == [1] * REQUESTS          # a larger one runs alone, never held forever


def test_bagels_pictures_carry_their_vit_patches() -> None:
    """BAGEL's LM reads no placeholders (its executor lays the rows out), so its image items say their rows:
    a 512 x 512 picture is resized by BAGEL's ViT transform to 518 x 518 (sides to multiples of 14), 37 x 37
    patches, more than its VAE's 32 x 32 latent tokens."""
    from runtime.entrypoints.http.multimodal import image_input
    from runtime.conductor.request import SizedInput

    plan = compile_file(str(REPO / "graphs" / "bagel.yaml"), Options(preset="bagel-7b")).plan
    item = image_input(plan, torch.zeros(512, 512, 3, dtype=torch.uint8))
    assert isinstance(item, SizedInput) and item.rows == 37 * 37
    omni = compile_file(str(REPO / "graphs" / "qwen3_omni.yaml"), Options(preset="tiny")).plan
    assert isinstance(image_input(omni, torch.zeros(8, 8, 3)), torch.Tensor)    # no family says: the tensor itself
