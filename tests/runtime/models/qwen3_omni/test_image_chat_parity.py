"""Text + image (and text + audio + image) chat through our processor, vision encoder and thinker vs
transformers' `Qwen3OmniMoeThinkerForConditionalGeneration` on the same random weights.

The content parts go through `OmniChatInputs` (data URL decoding, smart resize, normalising,
placeholders, grids), the items run as the conductor's for_each walks run them (`read_image`:
vision encoder, thinker with `embeds` + `deepstack`), then greedy decode steps. transformers gets
the same PIL image through its own `Qwen2VLImageProcessorPil` (the processor Qwen3-Omni uses for
images) and a prompt built by hand from the chat template's layout. fp32 logits within 1e-4 (as
every same-weights LM parity test here: summation order differs between our packed paged forward
and eager attention); positions equal `get_rope_index` exactly (integers).
"""
from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import WhisperFeatureExtractor
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from mstar_compiler.pipeline import Options, compile_file
from runtime.conductor.request import MediaInput
from runtime.conductor.local_run import LocalRun
from runtime.worker.executors import executor_for
from runtime.models.qwen3_omni.vision_grid import patchify, patchify_frames
from runtime.entrypoints.http.chat_inputs import chat_inputs_for
from runtime.model_executor.sampling import SamplingParams
from runtime.text import ByteTokenizer
from runtime.transport.messages import WorkItem
from runtime.transport.request_params import RequestParams
from runtime.worker.loader import build_module
from tests.runtime.models.qwen3_omni.omni_reference import preset, randomized_thinker
from tests.runtime.models.qwen3_omni.test_audio_chat_parity import audio_part, run_items, wav_bytes

# as the audio chat's parity (the vision tower's rows in place of the audio's): measured max 8.3e-7 on logits
# |l| <= 1.8, and 3.0e-7 on the hidden states the talker reads; both under 1% of the bound
ATOL = 1e-4
TALKER, VISION = preset("qwen3_omni_talker"), preset("qwen3_omni_vision_encoder")


def picture(height: int, width: int, seed: int) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def image_part(image: Image.Image) -> dict:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()}}


def hf_image_processor() -> Qwen2VLImageProcessorPil:
    return Qwen2VLImageProcessorPil(patch_size=VISION["patch_size"], merge_size=VISION["spatial_merge_size"],
                                    temporal_patch_size=VISION["temporal_patch_size"],
                                    min_pixels=VISION["min_pixels"], max_pixels=VISION["max_pixels"],
                                    image_mean=[0.5] * 3, image_std=[0.5] * 3)


@pytest.fixture(scope="module")
def served():
    plan = compile_file("graphs/qwen3_omni.yaml", Options(preset="tiny", placement="single")).plan
    modules = {n: build_module(plan.node(n), None).eval() for n in ("thinker", "audio_enc", "vision_enc")}
    reference = randomized_thinker(modules["thinker"], modules["audio_enc"], vision=modules["vision_enc"])
    executors = {n: executor_for(plan.node(n), m, 0, plan) for n, m in modules.items()}
    executors["thinker"] = LocalRun(executors["thinker"])      # its tables, as the conductor keeps them
    return plan, reference, executors


def image_ids(num_pads: int) -> list[int]:
    d = TALKER
    return [d["vision_start_token_id"], *[d["image_token_id"]] * num_pads, d["vision_end_token_id"]]


def chat_ids(*content: list[int]) -> list[int]:
    """The published template's layout, by hand: <im_start>user\\n{content}\\n<im_start>assistant\\n."""
    d = TALKER
    return [d["im_start_token_id"], d["user_token_id"], 10, *[t for c in content for t in c], 10,
            d["im_start_token_id"], d["assistant_token_id"], 10]


def check_against_reference(reference, executors, items, params, ids, **hf_inputs) -> list[torch.Tensor]:
    """Our logits per step == transformers' (greedy), positions == get_rope_index; our logits."""
    ours, positions = run_items(executors, items, params)
    sequence = torch.tensor([ids])
    for step, got in enumerate(ours):
        # with an attention mask, as the processor gives one: without, transformers falls back to 1-D positions
        out = reference(input_ids=sequence, attention_mask=torch.ones_like(sequence), **hf_inputs)
        torch.testing.assert_close(got[0], out.logits[0, -1], atol=ATOL, rtol=0, msg=f"step {step}")
        sequence = torch.cat([sequence, out.logits[:, -1:].argmax(-1)], dim=1)
    expected, _ = reference.get_rope_index(sequence, image_grid_thw=hf_inputs.get("image_grid_thw"),
                                           video_grid_thw=hf_inputs.get("video_grid_thw"),
                                           second_per_grids=hf_inputs.get("video_second_per_grid"),
                                           attention_mask=torch.ones_like(sequence),
                                           audio_seqlens=hf_inputs["feature_attention_mask"].sum(-1)
                                           if "feature_attention_mask" in hf_inputs else None)
    fed = sequence.shape[1] - 1                   # the last argmax is never fed
    assert positions.shape == (3, fed)
    assert torch.equal(expected[:, 0, :fed].long(), positions)
    assert not torch.equal(positions[0], positions[1])   # the image rows have real 2-D positions
    return ours


def test_pixels_match_the_published_image_processor(served):
    plan, _, _ = served
    for height, width in ((40, 56), (13, 90), (120, 100)):     # upscaled, elongated, downscaled
        image = picture(height, width, seed=height)
        (item,) = chat_inputs_for(plan).chat_items([{"role": "user", "content": [image_part(image)]}],
                                                   ByteTokenizer())[1:2]
        expected = hf_image_processor()(image, return_tensors="pt")
        got, grid = patchify(item[1].value, VISION["patch_size"], VISION["spatial_merge_size"],
                             VISION["temporal_patch_size"])
        assert list(grid) == expected["image_grid_thw"][0].tolist()
        # the same PIL bicubic resize of the same uint8 pixels, then one float rescale-normalise each (float64 there,
        # fp32 here: an fp32 rounding apart at most, ulp 2.4e-7 in [-2, 2.2]); measured exact
        torch.testing.assert_close(got, expected["pixel_values"], atol=1e-6, rtol=0)


@torch.no_grad()
def test_text_and_image_logits_match_transformers_thinker(served):
    plan, reference, executors = served
    image = picture(40, 56, seed=3)
    messages = [{"role": "user", "content": [{"type": "text", "text": "Look: "}, image_part(image),
                                             {"type": "text", "text": "What?"}]}]
    processor = chat_inputs_for(plan)
    items = processor.chat_items(messages, ByteTokenizer())
    assert [dtype for dtype, _ in items] == ["text", "image", "text"]
    pixels = hf_image_processor()(image, return_tensors="pt")
    num_pads = int(pixels["image_grid_thw"].prod()) // VISION["spatial_merge_size"] ** 2
    ids = chat_ids(list(b"Look: "), image_ids(num_pads), list(b"What?"))
    assert [t for _, v in items for t in (v.tokens if isinstance(v, MediaInput) else v)] == ids
    ours = check_against_reference(reference, executors, items, processor.request_params(items), ids,
                                   pixel_values=pixels["pixel_values"], image_grid_thw=pixels["image_grid_thw"])
    # the image matters: another picture of the same size, other logits
    other = [items[0], ("image", processor.chat_items([{"role": "user", "content": [image_part(picture(40, 56, 4))]}],
                                                      ByteTokenizer())[1][1]), items[2]]
    assert (run_items(executors, other, processor.request_params(other))[0][0] - ours[0]).abs().max() > 10 * ATOL


@torch.no_grad()
def test_interleaved_audio_and_images_keep_their_order(served):
    """One message: text, image, text, audio, image — items, placeholders and logits in that order."""
    plan, reference, executors = served
    first, second = picture(32, 48, seed=5), picture(48, 32, seed=6)
    data = wav_bytes(1.1, 16000)
    messages = [{"role": "user", "content": [
        {"type": "text", "text": "A"}, image_part(first), {"type": "text", "text": "B"}, audio_part(data),
        image_part(second)]}]
    processor = chat_inputs_for(plan)
    items = processor.chat_items(messages, ByteTokenizer())
    assert [dtype for dtype, _ in items] == ["text", "image", "text", "audio", "text", "image", "text"]
    pixels = hf_image_processor()([first, second], return_tensors="pt")
    wave = items[3][1].value
    features = WhisperFeatureExtractor(feature_size=preset("qwen3_omni_audio_encoder")["num_mel_bins"],
                                       sampling_rate=16000)(wave.numpy(), sampling_rate=16000, padding=True,
                                                            return_attention_mask=True, return_tensors="pt")
    merge = VISION["spatial_merge_size"] ** 2
    d = TALKER
    audio = [d["audio_start_token_id"], *items[3][1].tokens, d["audio_end_token_id"]]
    ids = chat_ids([65], image_ids(int(pixels["image_grid_thw"][0].prod()) // merge), [66], audio,
                   image_ids(int(pixels["image_grid_thw"][1].prod()) // merge))
    check_against_reference(reference, executors, items, processor.request_params(items), ids,
                            pixel_values=pixels["pixel_values"], image_grid_thw=pixels["image_grid_thw"],
                            input_features=features["input_features"],
                            feature_attention_mask=features["attention_mask"])


@torch.no_grad()
def test_text_and_video_logits_match_transformers_thinker(served):
    """Three frames at 1 fps: padded to two temporal patches, 26 positions apart (2 s x 13 per second).

    transformers' video processor needs torchvision (not installed), so its input is our frames'
    pixels (each frame processed as the image test checks) in its video patch layout, which
    `patchify_frames` writes (Qwen2VLVideoProcessor.patchify: pad by repeating the last frame,
    (t, h/m, w/m, m, m, C, temporal, p, p))."""
    plan, reference, executors = served
    frames = [picture(32, 48, seed=10 + k) for k in range(3)]
    part = {"type": "video", "fps": 1, "video": [image_part(f)["image_url"]["url"] for f in frames]}
    processor = chat_inputs_for(plan)
    items = processor.chat_items([{"role": "user", "content": [part, {"type": "text", "text": "?"}]}],
                                 ByteTokenizer())
    assert [dtype for dtype, _ in items] == ["text", "image", "text"]
    video = items[1][1]
    assert video.value.shape[0] == 4 and torch.equal(video.value[3], video.value[2])   # padded with the last
    patches, grid = patchify_frames(video.value, VISION["patch_size"], VISION["spatial_merge_size"],
                                    VISION["temporal_patch_size"])
    d = TALKER
    pads = [d["vision_start_token_id"], *[d["video_token_id"]] * len(video.tokens), d["vision_end_token_id"]]
    ids = chat_ids(pads, list(b"?"))
    check_against_reference(reference, executors, items, processor.request_params(items), ids,
                            pixel_values_videos=patches, video_grid_thw=torch.tensor([grid]),
                            video_second_per_grid=torch.tensor([2.0]))


@torch.no_grad()
def test_the_prompt_streams_to_the_talker_as_one_item_with_layer_states_at_pictures(served):
    """Voice chat: the prompt's pieces (text, image, text) reach the talker as one `hidden` item whose
    `mm` rows are transformers' `hidden_states[accept_hidden_layer]` at the image's placeholders."""
    plan, reference, executors = served
    image = picture(40, 56, seed=3)
    processor = chat_inputs_for(plan)
    items = processor.chat_items([{"role": "user", "content": [image_part(image), {"type": "text", "text": "?"}]}],
                                 ByteTokenizer())
    thinker, vision = executors["thinker"], executors["vision_enc"]
    thinker.open(1, RequestParams(sampling=SamplingParams(temperature=0.0), family=processor.request_params(items)))
    outputs = []
    try:
        for dtype, value in items:
            ins = {}
            if dtype == "image":
                (enc,) = vision.run([WorkItem(request_id=1, step=0, walk="read_image")], [{"image": value.value}])
                ins = {"embeds": enc.outputs["hidden"], "deepstack": enc.outputs["deepstack"]}
            tokens = value.tokens if isinstance(value, MediaInput) else value
            media = [value if isinstance(value, MediaInput) else None]
            (result,) = thinker.run([WorkItem(request_id=1, step=0, walk=f"read_{dtype}", tokens=tokens)], [ins], media)
            outputs.append(result.outputs)
    finally:
        thinker.close(1, kv_only=False)
    assert ["hidden" in o for o in outputs] == [False, False, True]
    ids = torch.tensor([t for _, v in items for t in (v.tokens if isinstance(v, MediaInput) else v)])
    prompt = outputs[-1]
    assert torch.equal(prompt["hidden:ids"], ids) and prompt["hidden"].shape[0] == len(ids)
    pixels = hf_image_processor()(image, return_tensors="pt")
    states = reference(input_ids=ids[None], attention_mask=torch.ones_like(ids[None]), output_hidden_states=True,
                       **pixels).hidden_states[TALKER["accept_hidden_layer"]][0]
    is_pad = ids == TALKER["image_token_id"]
    torch.testing.assert_close(prompt["hidden:mm"][is_pad], states[is_pad], atol=ATOL, rtol=0)
    assert not prompt["hidden:mm"][~is_pad].any()
