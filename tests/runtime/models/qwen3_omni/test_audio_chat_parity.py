"""Text + audio chat through our processor, audio encoder and thinker executors vs transformers' thinker.

The request's content parts go through `OmniChatInputs` (decoding, resampling, placeholders),
the input items are run as the conductor's for_each walks run them (`read_text`, then
`read_audio`: audio encoder, thinker with `embeds`, then `read_text`), and then greedy decode
steps. transformers gets the same waveform, its own WhisperFeatureExtractor features with
the published processor's audio arguments, and a prompt built by hand from the chat
template's layout. fp32 logits within 1e-4 (the tolerance of every same-weights LM parity
test here: summation order differs between the packed paged forward and eager attention).
"""
from __future__ import annotations

import base64
import io
import math

import numpy as np
import pytest
import soundfile
import torch
from transformers import WhisperFeatureExtractor
from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import _get_feat_extract_output_lengths

from mstar_compiler.pipeline import Options, compile_file
from runtime.conductor.request import MediaInput
from runtime.conductor.local_run import LocalRun
from runtime.worker.executors import executor_for
from runtime.entrypoints.http.chat_inputs import chat_inputs_for
from runtime.text import ByteTokenizer
from runtime.transport.messages import WorkItem
from runtime.worker.loader import build_module
from tests.runtime.models.qwen3_omni.omni_reference import preset, randomized_thinker
from runtime.model_executor.sampling import SamplingParams
from runtime.transport.request_params import RequestParams

# fp32, transformers' thinker (and audio tower) against ours on the same weights: the same layers in other op orders
# (fused projections, paged attention, the MoE's per-expert GEMMs), a few ulps (eps 1.2e-7) per layer on logits
# |l| <= 1.4; measured max 8.3e-7, 0.8% of the bound
ATOL = 1e-4
DECODE_STEPS = 4
TALKER = preset("qwen3_omni_talker")


def wav_bytes(seconds: float, rate: int, hz: float = 330.0, fmt: str = "WAV") -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    wave = 0.4 * np.sin(2 * math.pi * hz * t) + 0.05 * np.random.default_rng(1).standard_normal(t.shape)
    buf = io.BytesIO()
    soundfile.write(buf, wave.astype(np.float32), rate, format=fmt)
    return buf.getvalue()


def audio_part(data: bytes, fmt: str = "wav") -> dict:
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    plan = compile_file("graphs/qwen3_omni.yaml", Options(preset="tiny", placement="single")).plan
    modules = {n: build_module(plan.node(n), None).eval() for n in ("thinker", "audio_enc")}
    reference = randomized_thinker(modules["thinker"], modules["audio_enc"])
    executors = {n: executor_for(plan.node(n), m, 0, plan) for n, m in modules.items()}
    executors["thinker"] = LocalRun(executors["thinker"])      # its tables, as the conductor keeps them
    return plan, reference, executors


def reference_ids(num_pads: int, question: bytes) -> list[int]:
    """The published template's layout, by hand: <im_start>user\\n<audio>...</audio>question\\n<im_start>assistant\\n."""
    d = TALKER
    audio = [d["audio_start_token_id"], *[d["audio_token_id"]] * num_pads, d["audio_end_token_id"]]
    return [d["im_start_token_id"], d["user_token_id"], 10, *audio, *question, 10,
            d["im_start_token_id"], d["assistant_token_id"], 10]


def run_items(executors, items, params: dict | None = None) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Our thinker's last-row logits after the whole prompt and after each greedy decode step; the
    (3, N) M-RoPE positions of every row it fed."""
    run = executors["thinker"]
    thinker = run.executor
    logits, positions = [], []
    spy_logits, spy_positions = thinker.model.compute_logits, thinker.positions
    thinker.model.compute_logits = lambda h: logits.append(spy_logits(h)) or logits[-1]
    thinker.positions = lambda item, start: positions.append(spy_positions(item, start)) or positions[-1]
    run.open(1, RequestParams(sampling=SamplingParams(temperature=0.0), family=dict(params or {})))
    try:
        for dtype, value in items:
            if isinstance(value, MediaInput):
                encoder, port, walk = (("vision_enc", "image", "read_image") if dtype == "image"
                                       else ("audio_enc", "audio", "read_audio"))
                (enc,) = executors[encoder].run([WorkItem(request_id=1, step=0, walk=walk)], [{port: value.value}])
                embeds = {"embeds": enc.outputs["hidden"]}
                if "deepstack" in enc.outputs:
                    embeds["deepstack"] = enc.outputs["deepstack"]
                result = run.run([WorkItem(request_id=1, step=1, walk=walk, tokens=value.tokens)], [embeds], [value])
            else:
                result = run.run([WorkItem(request_id=1, step=0, walk="read_text", tokens=value)], [{}])
        for _ in range(DECODE_STEPS):
            result = run.run([WorkItem(request_id=1, step=0, walk="think", tokens=result[0].tokens)], [{}])
    finally:
        run.close(1, kv_only=False)
        thinker.model.compute_logits, thinker.positions = spy_logits, spy_positions
    return logits[len(items) - 1:], torch.cat(positions, dim=-1)    # from the prompt's last row on


@pytest.mark.parametrize("rate,fmt", [(16000, "wav"), (22050, "wav"), (24000, "mp3")])
@torch.no_grad()
def test_text_and_audio_logits_match_transformers_thinker(served, rate, fmt):
    plan, reference, executors = served
    data = wav_bytes(1.7, rate, fmt=fmt.upper())
    question = b"What is this?"
    messages = [{"role": "user", "content": [audio_part(data, fmt), {"type": "text", "text": question.decode()}]}]
    items = chat_inputs_for(plan).chat_items(messages, ByteTokenizer())
    assert [dtype for dtype, _ in items] == ["text", "audio", "text"]
    wave = items[1][1].value
    assert wave.shape[0] == math.ceil(soundfile.info(io.BytesIO(data)).frames * 16000 / rate)

    extractor = WhisperFeatureExtractor(feature_size=preset("qwen3_omni_audio_encoder")["num_mel_bins"],
                                        sampling_rate=16000)
    features = extractor(wave.numpy(), sampling_rate=16000, padding=True, truncation=False,
                         return_attention_mask=True, return_tensors="pt")
    num_pads = int(_get_feat_extract_output_lengths(features["attention_mask"].sum(-1), 50)[0])
    ids = reference_ids(num_pads, question)
    assert [t for _, v in items for t in (v.tokens if isinstance(v, MediaInput) else v)] == ids

    ours, positions = run_items(executors, items)
    sequence = torch.tensor([ids])
    for step, got in enumerate(ours):
        out = reference(input_ids=sequence, input_features=features["input_features"],
                        feature_attention_mask=features["attention_mask"])
        torch.testing.assert_close(got[0], out.logits[0, -1], atol=ATOL, rtol=0, msg=f"step {step}")
        if step == 0:     # the audio rows matter: the pads' own embeddings give other logits
            assert (reference(input_ids=sequence).logits[0, -1] - got[0]).abs().max() > 100 * ATOL
        sequence = torch.cat([sequence, out.logits[:, -1:].argmax(-1)], dim=1)
    expected_positions, _ = reference.get_rope_index(sequence, attention_mask=torch.ones_like(sequence),
                                                     audio_seqlens=features["attention_mask"].sum(-1))
    fed = sequence.shape[1] - 1                  # the last argmax is never fed
    assert positions.shape == (3, fed)
    assert torch.equal(expected_positions[:, 0, :fed].long(), positions)


def test_audio_rows_differ_from_pads(served):
    """The encoder's rows are what the thinker reads: two different sounds, two different answers."""
    plan, _, executors = served
    processor = chat_inputs_for(plan)
    answers = []
    for hz in (330.0, 900.0):
        messages = [{"role": "user", "content": [audio_part(wav_bytes(1.2, 16000, hz)), {"type": "text", "text": "?"}]}]
        logits, _ = run_items(executors, processor.chat_items(messages, ByteTokenizer()))
        answers.append(logits[0])
    assert (answers[0] - answers[1]).abs().max() > 10 * ATOL      # well above the parity tolerance
