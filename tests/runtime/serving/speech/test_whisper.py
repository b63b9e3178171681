"""Whisper served through `mstar-run --weights ROOT` from a published-layout checkpoint, answering the real
`openai` client's transcriptions and translations.

ROOT/whisper-large-v3/ holds a tiny transformers `WhisperForConditionalGeneration`'s tensors under their
published names (`model.encoder.*`, `model.decoder.*`; the tied output projection not stored, as
published) and a byte-level tokenizer with Whisper's special tokens; the graph is graphs/whisper.yaml
with its large-v3 mapping at tiny dims. Every transcript equals transformers' greedy `generate` on the
same model (language given or detected, transcribe or translate, alone or batched with others, a second
30 s window prompted with the first's text), decoded by the `tokenizers` library.
"""
from __future__ import annotations

import asyncio
import copy
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import openai
import pytest
import soundfile
import torch
import yaml
from safetensors.torch import save_file
from transformers import WhisperFeatureExtractor

from mstar_compiler.catalogue.whisper import PRESETS
from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from bench import whisper_reference as ref
from tests.runtime.serving.conftest import Server, serve
from tests.runtime.serving.published_layouts import PRESET, published_preset

DIMS = PRESETS["tiny"]
MAX_NEW = 64           # text tokens per window: the test preset's max_tokens (the graph's default is 440)
RATE = 16000


@dataclass
class Served:
    server: Server
    hf: torch.nn.Module
    tokenizer: object
    root: Path

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.server.url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def whisper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("whisper")
    hf = ref.model(DIMS)
    repo = tmp / "root" / "whisper-large-v3"
    tokenizer = ref.write_tokenizer(repo)
    tensors = {k: v.contiguous() for k, v in hf.state_dict().items() if k != "proj_out.weight"}
    save_file(tensors, str(repo / "model.safetensors"))
    hf.config.to_json_file(str(repo / "config.json"))
    for server in serve(compile_whisper(tmp), "--weights", str(tmp / "root")):
        yield Served(server, hf, tokenizer, tmp / "root")


def compile_whisper(tmp: Path, decoder_dims: dict | None = None) -> str:
    """graphs/whisper.yaml's large-v3 mapping at tiny dims (and `decoder_dims`), MAX_NEW tokens a window."""
    graph = published_preset(tmp, "whisper", "large-v3", node_dims={"decoder": decoder_dims} if decoder_dims else None)
    data = yaml.safe_load(graph.read_text())
    data["presets"][PRESET]["params"] = {"max_tokens": MAX_NEW}
    graph.write_text(yaml.safe_dump(data, sort_keys=False))
    plan = tmp / "whisper.plan.bin"
    plan.write_bytes(compile_file(str(graph), Options(preset=PRESET)).data)
    return str(plan)


def audio(seconds: float, seed: int) -> np.ndarray:
    """A chirp under noise: different audio per seed."""
    g = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.3 * np.sin(2 * np.pi * (200 + 150 * seed) * t * (1 + t)) + 0.05 * g.standard_normal(t.size)
            ).astype(np.float32)


def wav(samples: np.ndarray) -> io.BytesIO:
    buf = io.BytesIO()
    soundfile.write(buf, samples, RATE, format="WAV", subtype="FLOAT")
    buf.seek(0)
    buf.name = "speech.wav"
    return buf


def features(samples: np.ndarray) -> torch.Tensor:
    """transformers' own feature extractor (30 s padded log-mel), the oracle's input."""
    fe = WhisperFeatureExtractor(feature_size=DIMS["num_mel_bins"])
    return fe(samples, sampling_rate=RATE, return_tensors="pt").input_features


def expected(served: Served, samples: np.ndarray, language: str | None, task: str = "transcribe",
             previous: list[int] | None = None) -> tuple[list[int], str]:
    """transformers' greedy tokens for one window and their text (specials skipped)."""
    hf = served.hf
    if previous:
        prompt = torch.tensor([served.tokenizer.token_to_id("<|startofprev|>"), *previous[-223:]])
        with torch.no_grad():
            out = hf.generate(features(samples), language=language, task=task, prompt_ids=prompt,
                              max_new_tokens=min(MAX_NEW, DIMS["max_target_positions"] - len(prompt) - 4),
                              do_sample=False, return_timestamps=False)
        tokens = out.tolist()[0]
        tokens = tokens[tokens.index(ref.TEXT + 1) + 1:] if ref.TEXT + 1 in tokens else tokens
    else:
        tokens = ref.generate(hf, features(samples), language, task, MAX_NEW)[0]
    text = [t for t in tokens if t < ref.TEXT]
    return text, served.tokenizer.decode(text)


def test_transcription_equals_transformers_generate(whisper: Served) -> None:
    samples = audio(3.0, 1)
    got = whisper.client().audio.transcriptions.create(model="whisper-large-v3", file=wav(samples), language="en")
    tokens, text = expected(whisper, samples, "en")
    assert len(tokens) > MAX_NEW // 2, "the reference model writes text (its special tokens are scaled down)"
    assert got.text == text


def test_detected_language_and_translation_equal_transformers(whisper: Served) -> None:
    samples = audio(2.0, 2)
    client = whisper.client()
    got = client.audio.transcriptions.create(model="whisper-large-v3", file=wav(samples))
    assert got.text == expected(whisper, samples, None)[1]
    got = client.audio.translations.create(model="whisper-large-v3", file=wav(samples))
    assert got.text == expected(whisper, samples, None, "translate")[1]
    named = client.audio.transcriptions.create(model="whisper-large-v3", file=wav(samples), language="French")
    assert named.text == expected(whisper, samples, "fr")[1]          # a language by its name, as openai/whisper


def test_concurrent_transcriptions_each_equal_their_own(whisper: Served) -> None:
    clips = [audio(1.0 + i, 10 + i) for i in range(3)]

    async def all_at_once() -> list[str]:
        client = openai.AsyncOpenAI(base_url=f"{whisper.server.url}/v1", api_key="unused", max_retries=0, timeout=300)
        answers = await asyncio.gather(*(client.audio.transcriptions.create(
            model="whisper-large-v3", file=wav(c), language="en") for c in clips))
        return [a.text for a in answers]
    got = asyncio.run(all_at_once())
    assert got == [expected(whisper, c, "en")[1] for c in clips]
    assert len(set(got)) == 3, "different audio, different transcripts"


def test_long_audio_runs_in_windows_each_prompted_with_the_one_before(whisper: Served) -> None:
    samples = audio(42.0, 3)
    got = whisper.client().audio.transcriptions.create(model="whisper-large-v3", file=wav(samples), language="en")
    first, first_text = expected(whisper, samples[:30 * RATE], "en")
    _, second_text = expected(whisper, samples[30 * RATE:], "en", previous=first)
    assert got.text == first_text + second_text


def test_verbose_json_asks_for_timestamps_and_times_its_segments(whisper: Served) -> None:
    samples = audio(35.0, 7)
    got = whisper.client().audio.transcriptions.create(model="whisper-large-v3", file=wav(samples), language="en",
                                                       response_format="verbose_json")
    assert got.duration == pytest.approx(35.0, abs=1e-3)       # rounded to ms
    assert got.language == "english" and got.task == "transcribe"       # OpenAI's answer: the name
    assert got.segments and got.segments[-1].end == 35.0
    assert got.segments[0].start <= 1.0, "a window's first timestamp is at most max_initial_timestamp_index in"
    assert all(a.end <= b.start for a, b in zip(got.segments, got.segments[1:]))
    assert all(s.start <= s.end for s in got.segments)
    assert any(s.start >= 30.0 for s in got.segments), "the second window's text is timed after 30 s"
    for s in got.segments:      # each segment's text is its own tokens', which are text tokens only
        assert s.tokens and max(s.tokens) < ref.TEXT and s.text == whisper.tokenizer.decode(s.tokens)
    windows = [[t for s in got.segments if (s.start >= 30) == second for t in s.tokens] for second in (False, True)]
    assert got.text == "".join(whisper.tokenizer.decode(w) for w in windows)


def test_timestamps_follow_transformers_timestamp_rules(whisper: Served) -> None:
    samples = audio(2.5, 4)
    got = whisper.client().audio.transcriptions.create(model="whisper-large-v3", file=wav(samples), language="en",
                                                       response_format="verbose_json")
    sot, first_time = ref.TEXT + 1, ref.TEXT + len(ref.special_names()) - 1501
    want = ref.generate_timestamped(whisper.hf, features(samples), [sot, sot + 1, sot + 102], MAX_NEW)
    times = [round((t - first_time) * 0.02, 2) for t in want if t >= first_time]
    assert times, "the rules make the first token a timestamp"
    assert [t for s in got.segments for t in s.tokens] == [t for t in want if t < ref.TEXT]
    assert got.segments[0].start == times[0]
    bounds = {b for s in got.segments for b in (s.start, s.end)}
    assert bounds <= {min(t, 2.5) for t in times} | {2.5}, "every boundary is a time the model wrote or the clip's end"
    assert all(a.end <= b.start for a, b in zip(got.segments, got.segments[1:]))


def clock(seconds: float, mark: str) -> str:
    whole = int(seconds)
    return f"00:{whole // 60:02d}:{whole % 60:02d}{mark}{round((seconds - whole) * 1000):03d}"


def test_srt_and_vtt_time_the_verbose_segments(whisper: Served) -> None:
    samples = audio(2.5, 4)
    client = whisper.client()
    segments = client.audio.transcriptions.create(model="whisper-large-v3", file=wav(samples), language="en",
                                                  response_format="verbose_json").segments
    srt = client.audio.transcriptions.create(model="whisper-large-v3", file=wav(samples), language="en",
                                             response_format="srt")
    assert srt == "".join(f"{i}\n{clock(s.start, ',')} --> {clock(s.end, ',')}\n{s.text.strip()}\n\n"
                          for i, s in enumerate(segments, 1))
    assert segments[-1].end == 2.5
    vtt = client.audio.transcriptions.create(model="whisper-large-v3", file=wav(samples), language="en",
                                             response_format="vtt")
    assert vtt == "WEBVTT\n\n" + "".join(f"{clock(s.start, '.')} --> {clock(s.end, '.')}\n{s.text.strip()}\n\n"
                                          for s in segments)


def test_streamed_transcript_is_the_whole_one(whisper: Served) -> None:
    samples = audio(1.5, 5)
    client = whisper.client()
    whole = client.audio.transcriptions.create(model="whisper-large-v3", file=wav(samples), language="en").text
    events = list(client.audio.transcriptions.create(model="whisper-large-v3", file=wav(samples), language="en",
                                                     stream=True))
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == whole
    assert events[-1].type == "transcript.text.done" and events[-1].text == whole


def test_a_windows_first_token_is_never_a_begin_suppressed_one(whisper: Served, tmp_path: Path) -> None:
    """The decoder's `begin_suppress_tokens` dims (the published generation config's " " and end of text) as
    transformers' SuppressTokensAtBeginLogitsProcessor applies them: here the token the model would write first."""
    samples = audio(1.5, 8)
    first = ref.generate(whisper.hf, features(samples), "en", "transcribe", 1)[0][0]
    saved = copy.deepcopy(whisper.hf.generation_config)
    try:
        whisper.hf.generation_config.begin_suppress_tokens = [first]
        want = expected(whisper, samples, "en")[1]
    finally:
        whisper.hf.generation_config = saved
    for server in serve(compile_whisper(tmp_path, {"begin_suppress_tokens": [first]}), "--weights", str(whisper.root)):
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)
        got = client.audio.transcriptions.create(model="whisper-large-v3", file=wav(samples), language="en").text
    assert got == want and got != expected(whisper, samples, "en")[1]


def test_bad_requests_are_400s_and_the_server_keeps_serving(whisper: Served) -> None:
    client = whisper.client()
    samples = audio(1.0, 6)
    with pytest.raises(openai.BadRequestError, match="language 'xx'"):
        client.audio.transcriptions.create(model="whisper-large-v3", file=wav(samples), language="xx")
    with pytest.raises(openai.BadRequestError, match="cannot stream"):
        client.audio.transcriptions.create(model="whisper-large-v3", file=wav(samples), response_format="srt",
                                           stream=True)
    with pytest.raises(openai.BadRequestError, match="not a decodable audio file"):
        client.audio.transcriptions.create(model="whisper-large-v3", file=("a.wav", b"not audio"))
    assert client.audio.transcriptions.create(model="whisper-large-v3", file=wav(samples), language="en").text


def test_a_model_that_draws_nothing_answers_the_image_routes_with_404(whisper: Served) -> None:
    client = whisper.client()
    with pytest.raises(openai.NotFoundError) as err:
        client.images.generate(model="whisper-large-v3", prompt="a fox", response_format="b64_json")
    assert err.value.body["code"] == "model_not_found" and "draws" in err.value.body["message"]
