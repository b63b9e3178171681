"""The speech path end to end against transformers' Qwen3OmniMoeForConditionalGeneration.generate.

transformers runs its thinker, builds the talker prompt, generates greedily with the code
predictor and decodes with code2wav. We take its thinker's token embeddings as the
thinker stream and run our talker prompt, `generate_frames` (talker + code predictor on
a paged cache) and code2wav streamed in left-context chunks of 25 frames: the waveform
must match.
"""
from __future__ import annotations

import pytest
import torch

from tests.runtime.models.qwen3_omni.omni_reference import checkpoint_tensors, hf_model, omni_config, preset, randomize
from runtime.model_executor.components import component_class
from tests.runtime.models.qwen3_omni.speech_reference import generate_frames
from runtime.models.qwen3_omni.talker_prompt import TalkerText, talker_prompt

TALKER = preset("qwen3_omni_talker")
THINKER_EOS = 510
MAX_TALKER_TOKENS = 32


def _prompt_ids() -> torch.Tensor:
    d = TALKER
    start, user, assistant, newline = d["im_start_token_id"], d["user_token_id"], d["assistant_token_id"], 11
    system = [start, 300, newline, 40, 41, THINKER_EOS, newline]
    return torch.tensor([system + [start, user, newline, 42, 43, 44, 45, THINKER_EOS, newline, start, assistant,
                                   newline]])


@pytest.fixture(scope="module")
def reference() -> hf_model.Qwen3OmniMoeForConditionalGeneration:
    torch.manual_seed(0)
    model = hf_model.Qwen3OmniMoeForConditionalGeneration(omni_config(preset("qwen3_moe_lm"))).eval()
    randomize(model, seed=11)
    return model


def _ours(reference: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module]:
    tensors = checkpoint_tensors(reference)
    built = []
    for kind, prefix in (("qwen3_omni_talker", "talker."), ("qwen3_omni_code_predictor", "talker.code_predictor."),
                         ("qwen3_omni_code2wav", "code2wav.")):
        module = component_class(kind)(preset(kind), {}).eval()
        skip = "talker.code_predictor." if kind == "qwen3_omni_talker" else None
        module.load_hf_state_dict({k[len(prefix):]: v for k, v in tensors.items()
                                   if k.startswith(prefix) and not (skip and k.startswith(skip))})
        built.append(module)
    return tuple(built)


@torch.no_grad()
def test_waveform_matches_transformers_generate(reference):
    d = TALKER
    suppressed = [i for i in range(d["codebook_size"], d["vocab_size"]) if i != d["codec_eos_token_id"]]
    prompt_ids = _prompt_ids()
    sequences, expected = reference.generate(
        input_ids=prompt_ids, speaker="ethan", thinker_max_new_tokens=6, thinker_eos_token_id=THINKER_EOS,
        talker_max_new_tokens=MAX_TALKER_TOKENS, talker_do_sample=False, talker_repetition_penalty=1.0,
        talker_suppress_tokens=suppressed)
    expected = expected.reshape(-1)
    talker, predictor, code2wav = _ours(reference)

    embed = reference.thinker.get_input_embeddings()
    thinker_embeds = embed(sequences[0])
    tts_embeds = embed(torch.tensor([d["tts_bos_token_id"], d["tts_eos_token_id"], d["tts_pad_token_id"]]))
    prompt = talker_prompt(talker, prompt_ids[0], thinker_embeds, None, tts_embeds, "ethan")
    text = TalkerText(talker, tts_embeds)
    text.push(thinker_embeds[prompt_ids.shape[1] + 1: -1])  # every generated token the thinker fed back
    text.finish()
    # transformers' last talker token gets no code predictor call: one frame fewer than tokens
    frames = generate_frames(talker, predictor, [prompt], [text], max_frames=MAX_TALKER_TOKENS - 1)[0]
    assert frames.shape[0] > 25, "want at least two code2wav chunks"

    pieces, start = [], 0
    while start < frames.shape[0]:
        end, context = min(start + 25, frames.shape[0]), min(25, start)
        pieces += code2wav.decode_chunks([frames[start - context: end]], [context])
        start = end
    got = torch.cat(pieces)
    assert got.shape == expected.shape == (code2wav.num_samples(frames.shape[0]),)
    # transformers' talker, code predictor and code2wav against ours, fp32, on the same weights and frames: other
    # op orders through three models, a few ulps (eps 1.2e-7) each; measured 7.8e-7 of the largest sample
    assert (got - expected).abs().max() <= 1e-4 * expected.abs().max()


@torch.no_grad()
def test_batched_requests_speak_as_they_would_alone(reference):
    """Continuous batching: requests with different prompts and text lengths, finishing at
    different steps, produce the frames each produces alone."""
    talker, predictor, _ = _ours(reference)
    d, generator = TALKER, torch.Generator().manual_seed(12)
    tts = torch.randn(3, d["thinker_hidden_size"], generator=generator)

    def request(prompt_len: int, text_len: int) -> tuple[torch.Tensor, TalkerText]:
        prompt = torch.randn(prompt_len, d["hidden_size"], generator=generator)
        text = TalkerText(talker, tts)
        text.push(torch.randn(text_len, d["thinker_hidden_size"], generator=generator))
        text.finish()
        return prompt, text

    specs = [(9, 3), (14, 0), (11, 7)]
    together = generate_frames(talker, predictor, *zip(*[request(*s) for s in specs]), max_frames=12)
    generator.manual_seed(12)
    tts = torch.randn(3, d["thinker_hidden_size"], generator=generator)
    for spec, frames in zip(specs, together):
        prompt, text = request(*spec)
        alone = generate_frames(talker, predictor, [prompt], [text], max_frames=12)[0]
        assert frames.shape[0] > 0 and torch.equal(frames, alone)


@torch.no_grad()
def test_talker_text_waits_for_the_thinker_then_says_eos_once_then_pads(reference):
    talker, _, _ = _ours(reference)
    width = TALKER["thinker_hidden_size"]
    tts = torch.randn(3, width, generator=torch.Generator().manual_seed(14))
    words = torch.randn(2, width, generator=torch.Generator().manual_seed(15))
    text = TalkerText(talker, tts)
    assert not text.is_ready()
    with pytest.raises(RuntimeError, match="ahead of the thinker"):
        text.next_row()
    text.push(words)
    rows = [text.next_row(), text.next_row()]
    assert not text.is_ready()
    text.finish()
    rows += [text.next_row(), text.next_row(), text.next_row()]
    expected = talker.project_text(torch.cat((words, tts[1:2], tts[2:3], tts[2:3])))
    # rows projected one at a time against a batch of 5: other GEMM blockings, a few fp32 ulps (eps 1.2e-7) at
    # |x| <= 0.86; measured max 1.8e-7, 5% of the bound
    assert torch.allclose(torch.stack(rows), expected, rtol=1e-5, atol=1e-6)
