"""Qwen3-Omni tiny hears, through a real `mstar-run` and the real `openai` client.

Chat with an `input_audio` part answers what transformers' thinker (holding the same seeded
weights) answers greedily for the same waveform and the published template's prompt;
voice chat with audio and image parts speaks the text chat's answer; `audio.transcriptions.create` takes
a WAV and an MP3; oversized, undecodable and over-long inputs get a 4xx and the server goes
on serving.
"""
from __future__ import annotations

import base64
import io

import openai
import pytest
import torch
from transformers import WhisperFeatureExtractor
from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import _get_feat_extract_output_lengths

from mstar_compiler.pipeline import Options, compile_file
from runtime.entrypoints.http.chat_inputs import chat_inputs_for
from runtime.text import ByteTokenizer
from runtime.worker.loader import build_module
from tests.runtime.models.qwen3_omni.omni_reference import preset, thinker_reference
from tests.runtime.models.qwen3_omni.test_audio_chat_parity import audio_part, reference_ids, wav_bytes
from tests.runtime.models.qwen3_omni.test_image_chat_parity import image_part, picture
from tests.runtime.serving.conftest import http as request_json
from tests.runtime.serving.speech.conftest import OMNI

MAX_TOKENS = 12


@pytest.fixture
def single(omni_single):
    return omni_single


def client_of(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


@torch.no_grad()
def greedy_reference(data: bytes, question: bytes) -> tuple[list[int], list[int]]:
    """(prompt ids, greedy answer ids) of transformers' thinker with the server's seeded weights."""
    plan = compile_file("graphs/qwen3_omni.yaml", Options(preset="tiny", placement="single")).plan
    messages = [{"role": "user", "content": [audio_part(data)]}]
    wave = chat_inputs_for(plan).chat_items(messages, ByteTokenizer())[1][1].value
    features = WhisperFeatureExtractor(feature_size=preset("qwen3_omni_audio_encoder")["num_mel_bins"],
                                       sampling_rate=16000)(
        wave.numpy(), sampling_rate=16000, padding=True, return_attention_mask=True, return_tensors="pt")
    reference = thinker_reference(build_module(plan.node("thinker"), None), build_module(plan.node("audio_enc"), None))
    ids = reference_ids(int(_get_feat_extract_output_lengths(features["attention_mask"].sum(-1), 50)[0]), question)
    sequence = torch.tensor([ids])
    for _ in range(MAX_TOKENS):
        logits = reference(input_ids=sequence, input_features=features["input_features"],
                           feature_attention_mask=features["attention_mask"]).logits
        sequence = torch.cat([sequence, logits[:, -1:].argmax(-1)], dim=1)
    return ids, sequence[0, len(ids):].tolist()


def test_chat_with_input_audio_answers_as_transformers_thinker(single) -> None:
    data, question = wav_bytes(1.5, 22050), b"What do you hear?"
    ids, answer = greedy_reference(data, question)
    reply = client_of(single).chat.completions.create(
        model=OMNI, max_tokens=MAX_TOKENS, temperature=0.0,
        messages=[{"role": "user", "content": [audio_part(data), {"type": "text", "text": question.decode()}]}])
    assert reply.usage.prompt_tokens == len(ids)
    assert reply.usage.completion_tokens == MAX_TOKENS
    assert reply.choices[0].message.content == ByteTokenizer().decode(answer)


def test_voice_chat_with_audio_and_image_parts_speaks_the_text_chat_answer(single) -> None:
    """Voice chat reads the same items as the text chat (the thinker's answer is the same, greedy) and
    the talker gets the whole prompt (one stream item however many pieces it is read in) and speaks."""
    messages = [{"role": "user", "content": [{"type": "text", "text": "Listen: "}, audio_part(wav_bytes(1.0, 16000)),
                                             image_part(picture(32, 48, 7)), {"type": "text", "text": "Say it."}]}]
    client = client_of(single)
    text = client.chat.completions.create(model=OMNI, messages=messages, max_tokens=MAX_TOKENS, temperature=0.0)
    transcript, pcm = "", b""
    for chunk in client.chat.completions.create(
            model=OMNI, messages=messages, max_tokens=MAX_TOKENS, temperature=0.0, modalities=["text", "audio"],
            audio={"voice": "chelsie", "format": "pcm16"}, stream=True):
        audio = chunk.choices[0].delta.audio if chunk.choices else None
        transcript += (getattr(audio, "transcript", None) or "") if audio is not None else ""
        pcm += base64.b64decode(getattr(audio, "data", None) or "") if audio is not None else b""
    assert transcript == text.choices[0].message.content
    assert len(pcm) > 0 and len(pcm) % 2 == 0          # pcm16 samples


@pytest.mark.parametrize("fmt", ["wav", "mp3"])
def test_transcriptions_take_wav_and_mp3_through_the_openai_client(single, fmt) -> None:
    data = wav_bytes(1.2, 16000 if fmt == "wav" else 24000, fmt=fmt.upper())
    client = client_of(single)
    result = client.audio.transcriptions.create(model=OMNI, file=(f"clip.{fmt}", io.BytesIO(data)))
    assert isinstance(result.text, str)
    again = client.audio.transcriptions.create(model=OMNI, file=(f"clip.{fmt}", io.BytesIO(data)),
                                               response_format="verbose_json", language="en")
    # samples / rate of the decoded clip: exact for the WAV; an MP3 decoder that kept the encoder's padding would add
    # a few ms (0.01 s is 240 samples at 24 kHz); measured exact for both (libsndfile trims it)
    assert abs(again.duration - 1.2) < 0.01
    plain = client.audio.transcriptions.create(model=OMNI, file=(f"clip.{fmt}", io.BytesIO(data)),
                                               response_format="text", language="en")
    assert plain == again.text                    # greedy, the same prompt: the same words


@pytest.mark.parametrize("extra,field", [({"include": ["logprobs"]}, "include[]"),
                                         ({"timestamp_granularities": ["word"]}, "timestamp_granularities[]")])
def test_transcription_fields_this_server_does_not_take_are_a_400_naming_them(single, extra, field) -> None:
    client = client_of(single)
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.transcriptions.create(model=OMNI, file=("clip.wav", io.BytesIO(wav_bytes(0.5, 16000))),
                                           response_format="verbose_json", **extra)
    assert info.value.body["param"] == field and info.value.body["code"] == "unsupported_field", info.value.body
    assert isinstance(client.audio.transcriptions.create(
        model=OMNI, file=("clip.wav", io.BytesIO(wav_bytes(0.5, 16000)))).text, str)   # and it serves on


@pytest.mark.parametrize("fields,field,message", [
    ({"response_format": "docx"}, "response_format",
     "response_format must be one of ('json', 'text', 'verbose_json', 'srt', 'vtt')"),
    ({"extra_body": {"temperature": "warm"}}, "temperature", "temperature must be a number"),
    ({"extra_body": {"stream": "maybe"}}, "stream", "stream must be 'true' or 'false'"),
])
def test_a_transcription_form_field_of_the_wrong_kind_is_a_400_naming_it(single, fields, field, message) -> None:
    """The form's text fields are read into their schema (schemas.TranscriptionForm): a value that is
    not what the field takes is refused, naming the field, and the server serves on."""
    client = client_of(single)
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.transcriptions.create(model=OMNI, file=("clip.wav", io.BytesIO(wav_bytes(0.5, 16000))), **fields)
    assert info.value.body["param"] == field and info.value.body["message"] == message, info.value.body
    assert isinstance(client.audio.transcriptions.create(
        model=OMNI, file=("clip.wav", io.BytesIO(wav_bytes(0.5, 16000))), temperature=0.0).text, str)


def test_timed_formats_and_translations_are_for_speech_recognition_models(single) -> None:
    """srt / vtt need timed segments, which a chat LM's transcript does not have (a 400 saying so); translations
    are a speech recognition family's (a 404 naming the model); the server serves on."""
    client = client_of(single)
    clip = ("clip.wav", io.BytesIO(wav_bytes(0.5, 16000)))
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.transcriptions.create(model=OMNI, file=clip, response_format="srt")
    assert info.value.body["param"] == "response_format" and "needs timed segments" in info.value.body["message"]
    with pytest.raises(openai.NotFoundError) as missing:
        client.audio.translations.create(model=OMNI, file=("clip.wav", io.BytesIO(wav_bytes(0.5, 16000))))
    assert f"the model '{OMNI}' does not translate speech" in missing.value.body["message"]
    assert isinstance(client.audio.transcriptions.create(
        model=OMNI, file=("clip.wav", io.BytesIO(wav_bytes(0.5, 16000)))).text, str)


def test_streamed_transcription_ends_with_the_whole_text(single) -> None:
    events = list(client_of(single).audio.transcriptions.create(
        model=OMNI, file=("clip.wav", io.BytesIO(wav_bytes(1.0, 16000))), stream=True))
    assert events[-1].type == "transcript.text.done"
    assert events[:-1] and all(e.type == "transcript.text.delta" for e in events[:-1])
    assert "".join(e.delta for e in events[:-1]) == events[-1].text


@pytest.mark.parametrize("part,status,code", [
    (audio_part(wav_bytes(9.0, 8000)), 413, "audio_too_long"),                # tiny preset: max_audio_seconds 8
    (audio_part(b"RIFF....WAVEnot really audio"), 400, "invalid_audio"),
    ({"type": "input_audio", "input_audio": {"data": "%%%", "format": "wav"}}, 400, "invalid_audio"),
    ({"type": "input_audio", "input_audio": {"data": "", "format": "ogg"}}, 400, None),
])
def test_bad_audio_gets_a_4xx_and_the_server_goes_on(single, part, status, code) -> None:
    got, body = request_json("POST", f"{single.url}/v1/chat/completions",
                             {"model": OMNI, "messages": [{"role": "user", "content": [part]}]})
    assert got == status and body["error"]["message"]
    assert code is None or body["error"]["code"] == code
    assert request_json("GET", f"{single.url}/health")[0] == 200


def test_too_many_parts_in_a_message_gets_a_400(single) -> None:
    parts = [{"type": "text", "text": "a"}] * 8 + [audio_part(wav_bytes(0.5, 16000))]   # limit 8
    got, body = request_json("POST", f"{single.url}/v1/chat/completions",
                             {"model": OMNI, "messages": [{"role": "user", "content": parts}]})
    assert got == 400 and body["error"]["code"] == "too_many_parts"
