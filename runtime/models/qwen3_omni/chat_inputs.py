"""Qwen3-Omni's chat inputs: content parts -> ChatML ids with expanded placeholders + media items.

The published chat template writes each message as `<|im_start|>{role}\n{content}<|im_end|>\n`,
its content parts concatenated in order, an audio part as `<|audio_start|><|audio_pad|><|audio_end|>`;
the processor then repeats `<|audio_pad|>` once per audio-encoder output row (transformers'
`Qwen3OmniMoeProcessor.replace_audio_token`: `_get_feat_extract_output_lengths` of the
log-mel frame count, 13 rows per 100 frames). With a checkpoint tokenizer the template is
the checkpoint's own; with seeded random weights (byte tokenizer, no template) the ChatML
specials are the ids the talker preset names, as `runtime.models.qwen3_omni.serving.omni_prompt`
writes them for text.

An `image_url` part (a data URL, decoded by `runtime.entrypoints.http.multimodal.decode_image` with its
format and pixel limits) is `<|vision_start|><|image_pad|><|vision_end|>`, a `video` part (a list
of frame data URLs) or `video_url` part (an MP4 / WebM data URL whose frames are sampled as the
published processor samples them, runtime/models/qwen3_omni/vision_inputs.py) the same with `<|video_pad|>`;
the processor repeats the pad once per merged vision token.

The prompt becomes interleaved input items for the graph's `for_each` state, in the order of
the parts: text runs of ids (`read_text`), per audio part a `MediaInput` (`read_audio`): the
16 kHz waveform for the audio encoder, the pads for the thinker, which puts the encoder's
rows there; per image or video a `VisualInput` (`read_image`): processed pixels and the grid
of their 3-D M-RoPE positions, which reach the thinker as the request param `mrope_grids`
(`request_params`). Audio positions are sequential (transformers' `get_rope_index` gives audio
t = h = w = the running index), as text's.

Limits come from the graph's params, each checked before the work it bounds: `max_audio_seconds`
(from the audio file's header), `max_image_pixels` and `max_video_frame_pixels` (from the image or
video header), `max_video_frames` (the frames listed, or those sampled from a file's frame count)
and `max_parts_per_message`. Audio inside a video is refused when asked for (`use_audio_in_video`,
as the published processor's default, reads only the pictures of a video file).
"""
from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from mstar_compiler.plan import Plan
from runtime.conductor.request import MediaInput
from runtime.model_executor.log_mel import HOP_LENGTH
from runtime.models.qwen3_omni.qwen3_omni_audio_encoder import cnn_tokens
from runtime.models.qwen3_omni.vision_inputs import VisionProcessor, VisualInput, grids_param
from runtime.entrypoints.http.audio_decode import decode_audio
from runtime.entrypoints.http.errors import ApiError
from runtime.entrypoints.http.multimodal import data_url_bytes, decode_image
from runtime.entrypoints.http.video_decode import VideoHeader, decode_video, video_type
from runtime.text import ByteTokenizer

AUDIO_FORMATS = ("wav", "mp3")
ASR_PROMPT = "Transcribe the audio into text."
ASR_PROMPT_LANGUAGE = "Transcribe the {language} audio into text."
LIMIT_PARAMS = ("max_audio_seconds", "max_parts_per_message", "max_video_frames", "max_image_pixels",
                "max_video_frame_pixels")
DEFAULT_FPS = 2.0      # the rate the published video processor samples frames at
LANGUAGES = {"en": "English", "zh": "Chinese", "de": "German", "fr": "French", "es": "Spanish", "it": "Italian",
             "ja": "Japanese", "ko": "Korean", "pt": "Portuguese", "ru": "Russian"}


class OmniChatInputs:
    """The processor of one Qwen3-Omni plan (module docstring)."""

    def __init__(self, plan: Plan, talker: dict[str, Any], audio: dict[str, Any],
                 vision: dict[str, Any] | None = None) -> None:
        params = {p.name: p.default for p in plan.params}
        missing = [k for k in LIMIT_PARAMS if k not in params]
        if missing:
            raise ValueError(f"graph '{plan.source}' serves Qwen3-Omni chat inputs but declares no param(s) "
                             f"{missing}: add them under params: (the limits of audio, pictures, video frames "
                             f"and parts per request)")
        self.max_audio_seconds = float(params["max_audio_seconds"])
        self.max_parts = int(params["max_parts_per_message"])
        self.max_frames = int(params["max_video_frames"])
        self.max_image_pixels = int(params["max_image_pixels"])
        self.max_frame_pixels = int(params["max_video_frame_pixels"])
        self.model = plan.model
        self.ids = talker
        self.vision = None if vision is None else VisionProcessor(
            vision, (talker["image_token_id"], talker["video_token_id"]))
        self.markers = {AUDIO_MARKER: talker["audio_token_id"], IMAGE_MARKER: talker["image_token_id"],
                        VIDEO_MARKER: talker["video_token_id"]}
        self.sample_rate = int(audio["sampling_rate"])
        self.chunk = 2 * int(audio["n_window"])

    def num_audio_tokens(self, num_samples: int) -> int:
        """Encoder rows (= pads) for a waveform of `num_samples` (the processor's output length)."""
        full, rest = divmod(num_samples // HOP_LENGTH, self.chunk)
        return full * cnn_tokens(self.chunk) + cnn_tokens(rest)

    def chat_items(self, messages: list[dict], tokenizer: Any) -> list[tuple[str, Any]] | None:
        if not any(isinstance(m.get("content"), list) and any(_kind(p) != "text" for p in m["content"])
                   for m in messages):
            return None
        media: list[Any] = []
        ids = self._prompt_ids(messages, tokenizer, media)
        return self._items(ids, media)

    def request_params(self, items: list[tuple[str, Any]]) -> dict[str, Any]:
        """Params the thinker reads about these items: how many Runs its prompt takes (it streams the
        prompt to the talker as one item) and the pictures' M-RoPE grids."""
        grids = grids_param(items)
        return {"num_prompt_items": len(items), **({"mrope_grids": grids} if grids else {})}

    def transcription_messages(self, audio_part: dict, language: str | None, prompt: str | None) -> list[dict]:
        ask = ASR_PROMPT_LANGUAGE.format(language=LANGUAGES.get(language, language)) if language else ASR_PROMPT
        messages = [{"role": "system", "content": prompt}] if prompt else []
        return messages + [{"role": "user", "content": [audio_part, {"type": "text", "text": ask}]}]

    # ---- the prompt -----------------------------------------------------------------

    def _prompt_ids(self, messages: list[dict], tokenizer: Any, media: list[Any]) -> list[int]:
        """ChatML ids with one pad per media part; the decoded media appended to `media` in order."""
        contents = [self._content(m["content"], i, media) for i, m in enumerate(messages)]
        if not isinstance(tokenizer, ByteTokenizer):
            text = tokenizer.render_chat([{"role": m["role"], "content": c} for m, c in zip(messages, contents)],
                                         add_generation_prompt=True)
            return tokenizer.encode(text, add_special_tokens=False)
        d, ids = self.ids, []
        roles = {"user": [d["user_token_id"]], "assistant": [d["assistant_token_id"]], "system": list(b"system")}
        for m, content in zip(messages, contents):
            if m["role"] not in roles:
                raise ApiError(400, f"unknown role '{m['role']}' (system, user, assistant)", "messages")
            ids += [d["im_start_token_id"], *roles[m["role"]], *tokenizer.encode("\n"),
                    *self._byte_content(content, tokenizer), *tokenizer.encode("\n")]
        return ids + [d["im_start_token_id"], d["assistant_token_id"], *tokenizer.encode("\n")]

    def _content(self, content: str | list, i: int, media: list[Any]) -> str:
        """The message's content as template text, media parts as their marker strings."""
        if isinstance(content, str):
            return content
        if len(content) > self.max_parts:
            raise ApiError(400, f"messages[{i}].content has {len(content)} parts, more than this model's limit of "
                                f"{self.max_parts} (param max_parts_per_message)", f"messages[{i}].content",
                           "too_many_parts")
        return "".join(self._part(p, f"messages[{i}].content[{j}]", media) for j, p in enumerate(content))

    def _part(self, part: Any, field: str, media: list[Any]) -> str:
        kind = _kind(part)
        if kind == "text":
            return part["text"]
        if kind == "input_audio":
            media.append(self._audio(part.get("input_audio"), f"{field}.input_audio"))
            return AUDIO_MARKER
        if kind in ("image_url", "video") and self.vision is None:
            raise ApiError(400, f"{field}: the model '{self.model}' has no vision encoder", field, "unsupported_input")
        if kind == "image_url":
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, dict) else url
            data = data_url_bytes(url, f"{field}.image_url")
            media.append(self.vision.image(decode_image(data, field, self.max_image_pixels, "max_image_pixels")))
            return IMAGE_MARKER
        if kind in ("video", "video_url"):
            media.append(self._video(part, field) if kind == "video" else self._video_file(part, field))
            return VIDEO_MARKER
        raise ApiError(400, f"{field}: a content part must be of type text, input_audio, image_url, video or "
                            f"video_url", field)

    def _video(self, part: dict, field: str) -> VisualInput:
        frames, fps = part.get("video"), self._fps(part, field)
        if not isinstance(frames, list) or not frames or not all(isinstance(f, str) for f in frames):
            raise ApiError(400, f"{field}.video must be a non-empty list of frame data URLs", f"{field}.video")
        self._check_frames(len(frames), f"{field}.video")
        pictures = [decode_image(data_url_bytes(f, f"{field}.video[{k}]"), f"{field}.video[{k}]",
                                 self.max_frame_pixels, "max_video_frame_pixels") for k, f in enumerate(frames)]
        return self.vision.video(pictures, fps, field)

    def _video_file(self, part: dict, field: str) -> VisualInput:
        """A video_url part: the file's frames sampled at `fps` as the published processor samples them."""
        url, fps = part.get("video_url"), self._fps(part, field)
        url = url.get("url") if isinstance(url, dict) else url
        where = f"{field}.video_url"
        demuxer = video_type(url if isinstance(url, str) else "", where)

        def pick(header: VideoHeader) -> list[int]:
            indices = self.vision.sample_frames(header.num_frames, header.fps, fps, where)
            self._check_frames(len(indices), where)
            return indices

        frames = decode_video(data_url_bytes(url, where), demuxer, where, self.max_frame_pixels, pick)
        return self.vision.video(frames, fps, field)

    def _fps(self, part: dict, field: str) -> float:
        if "audio" in part or part.get("use_audio_in_video"):
            raise ApiError(400, f"{field}: audio inside a video is not supported; send the sound as its own "
                                f"input_audio part", field, "unsupported_input")
        fps = part.get("fps", DEFAULT_FPS)
        if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not 0 < fps <= 60:
            raise ApiError(400, f"{field}.fps must be a number in (0, 60]", f"{field}.fps")
        return float(fps)

    def _check_frames(self, num_frames: int, field: str) -> None:
        if num_frames > self.max_frames:
            raise ApiError(413, f"{field} has {num_frames} frames, more than this model's limit of "
                                f"{self.max_frames} (param max_video_frames)", field, "video_too_long")

    def _audio(self, spec: Any, field: str) -> Any:
        if not isinstance(spec, dict) or not isinstance(spec.get("data"), str):
            raise ApiError(400, f"{field} must be an object {{data: base64, format: wav|mp3}}", field)
        if spec.get("format", "wav") not in AUDIO_FORMATS:
            raise ApiError(400, f"{field}.format must be one of {AUDIO_FORMATS}", f"{field}.format")
        try:
            data = base64.b64decode(spec["data"], validate=True)
        except (binascii.Error, ValueError):
            raise ApiError(400, f"{field}.data is not valid base64", f"{field}.data", "invalid_audio") from None
        return decode_audio(data, f"{field}.data", self.sample_rate, self.max_audio_seconds)

    def _byte_content(self, content: str, tokenizer: Any) -> list[int]:
        """Byte ids of template text whose media markers become the special ids."""
        d, ids = self.ids, []
        for k, text in enumerate(_MARKERS.split(content)):
            if k % 2 == 0:
                ids += tokenizer.encode(text, add_special_tokens=False)
            elif text == AUDIO_MARKER:
                ids += [d["audio_start_token_id"], d["audio_token_id"], d["audio_end_token_id"]]
            else:
                ids += [d["vision_start_token_id"], self.markers[text], d["vision_end_token_id"]]
        return ids

    def _items(self, ids: list[int], media: list[Any]) -> list[tuple[str, Any]]:
        """Text runs between the pads, and one media item per pad with its expanded placeholders."""
        pads = set(self.markers.values())
        kinds = [m.tokens[0] if isinstance(m, VisualInput) else self.ids["audio_token_id"] for m in media]
        if [t for t in ids if t in pads] != kinds:
            raise ApiError(400, f"the prompt's media placeholders do not match its {len(media)} media parts: a "
                                f"text part must not contain an audio, image or video pad token", "messages")
        items: list[tuple[str, Any]] = []
        run: list[int] = []
        parts = iter(media)
        for token in ids:
            if token not in pads:
                run.append(token)
                continue
            if run:
                items.append(("text", run))
                run = []
            part = next(parts)
            if isinstance(part, VisualInput):
                items.append(("image", part))
                continue
            wave, pad = part, token
            rows = self.num_audio_tokens(wave.shape[0])
            if rows == 0:
                raise ApiError(400, f"an audio part is {wave.shape[0]} samples long, too short for one encoder "
                                    f"row ({HOP_LENGTH} samples at {self.sample_rate} Hz)", "messages",
                               "invalid_audio")
            items.append(("audio", MediaInput(wave, [pad] * rows)))
        return items + ([("text", run)] if run else [])


AUDIO_MARKER = "<|audio_start|><|audio_pad|><|audio_end|>"
IMAGE_MARKER = "<|vision_start|><|image_pad|><|vision_end|>"
VIDEO_MARKER = "<|vision_start|><|video_pad|><|vision_end|>"
_MARKERS = re.compile("(" + "|".join(re.escape(m) for m in (AUDIO_MARKER, IMAGE_MARKER, VIDEO_MARKER)) + ")")


def _kind(part: Any) -> str | None:
    if not isinstance(part, dict):
        return None
    if part.get("type") == "text" and not isinstance(part.get("text"), str):
        return None
    return part.get("type")


def omni_chat_inputs(plan: Plan) -> OmniChatInputs | None:
    """A processor for plans with a Qwen3-Omni talker and audio encoder."""
    by_kind = {n.kind: n for n in plan.nodes}
    talker, audio = by_kind.get("qwen3_omni_talker"), by_kind.get("qwen3_omni_audio_encoder")
    if talker is None or audio is None:
        return None
    vision = by_kind.get("qwen3_omni_vision_encoder")
    return OmniChatInputs(plan, dict(talker.dims), dict(audio.dims), None if vision is None else dict(vision.dims))
