"""A Whisper window's tokens as timed segments, and the segments as OpenAI's response formats.

Within a window the model writes `<|t0|> text <|t1|>` pairs when asked for timestamps: each pair
closes a segment, times counted from the window's start. Text the model wrote without a closing
timestamp (or a window answered without timestamps) is one segment to the window's end.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from runtime.models.whisper.tokens import WhisperTokens


@dataclass
class Segment:
    start: float
    end: float
    tokens: list[int] = field(default_factory=list)
    text: str = ""


def window_segments(tokens: WhisperTokens, output: Sequence[int], offset: float, window_end: float,
                    decode: Callable[[list[int]], str]) -> list[Segment]:
    """The segments of one window's output tokens (specials other than timestamps skipped)."""
    found: list[Segment] = []
    current: Segment | None = None
    for token in output:
        if tokens.is_timestamp(token):
            at = min(offset + tokens.seconds(token), window_end)
            if current is not None and current.tokens:
                current.end = at
                found.append(current)
                current = None
            else:
                current = Segment(at, at)
        elif token < tokens.eot:
            if current is None:
                current = Segment(found[-1].end if found else offset, window_end)
            current.tokens.append(token)
    if current is not None and current.tokens:
        current.end = window_end
        found.append(current)
    for seg in found:
        seg.text = decode(seg.tokens)
    return found


def _clock(seconds: float, decimal: str) -> str:
    ms = int(round(seconds * 1000))
    return f"{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d}{decimal}{ms % 1000:03d}"


def srt(segments: Sequence[Segment]) -> str:
    return "".join(f"{i}\n{_clock(s.start, ',')} --> {_clock(s.end, ',')}\n{s.text.strip()}\n\n"
                   for i, s in enumerate(segments, 1))


def vtt(segments: Sequence[Segment]) -> str:
    return "WEBVTT\n\n" + "".join(f"{_clock(s.start, '.')} --> {_clock(s.end, '.')}\n{s.text.strip()}\n\n"
                                  for s in segments)


def verbose(task: str, language: str, duration: float, text: str, segments: Sequence[Segment],
            temperature: float) -> dict[str, Any]:
    """OpenAI's verbose_json body (the segments' log-probability and compression fields are not computed)."""
    return {"task": task, "language": language, "duration": round(duration, 3), "text": text,
            "segments": [{"id": i, "seek": int(round(s.start * 100)), "start": round(s.start, 2),
                          "end": round(s.end, 2), "text": s.text, "tokens": s.tokens, "temperature": temperature}
                         for i, s in enumerate(segments)]}
