"""Video files in requests: MP4 or WebM bytes -> the frames a model's processor samples, as pictures.

Decoding is FFmpeg's through PyAV (its wheels bundle the libraries, so no system codec is
needed). The demuxer is the one the data URL's type names, never probed: a probed file could
select a demuxer that opens other files or URLs (HLS, concat). Everything a limit needs is
read before any frame is decoded: the frame size from the stream header (a per-frame pixel
cap), the frame count from the container or by demuxing packets (no decoding), from which the
caller's `pick` chooses the frame indices and checks its own frame limit. Only the picked
frames are converted to pictures.
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Callable

import av
from PIL import Image

from runtime.entrypoints.http.errors import ApiError

VIDEO_TYPES = {"video/mp4": "mp4", "video/webm": "webm"}    # data URL type -> FFmpeg demuxer


@dataclass(frozen=True)
class VideoHeader:
    """What a video file says of itself before decoding."""

    width: int
    height: int
    num_frames: int
    fps: float


def video_type(url: str, field: str) -> str:
    """The demuxer for a `data:video/...;base64,` URL's type; 400 for any other type."""
    mime = url[len("data:"):url.find(";")] if url.startswith("data:") and ";" in url else ""
    if mime not in VIDEO_TYPES:
        raise ApiError(400, f"{field}: a video must be a data URL of type {' or '.join(VIDEO_TYPES)}, got "
                            f"{mime or 'none'}", field, "invalid_video")
    return VIDEO_TYPES[mime]


def decode_video(data: bytes, demuxer: str, field: str, max_frame_pixels: int,
                 pick: Callable[[VideoHeader], list[int]]) -> list[Image.Image]:
    """The RGB frames at `pick(header)` (ascending indices), in order; 400 if not decodable, 413 when a
    frame has more than `max_frame_pixels` (param max_video_frame_pixels)."""
    try:
        with av.open(io.BytesIO(data), mode="r", format=demuxer) as container:
            header = _header(container, field, max_frame_pixels)
            wanted = pick(header)
        with av.open(io.BytesIO(data), mode="r", format=demuxer) as container:
            frames = _frames(container, set(wanted))
    except (av.FFmpegError, ValueError, IndexError) as exc:
        raise ApiError(400, f"{field}: not a decodable {demuxer} video ({exc})", field, "invalid_video") from None
    if len(frames) != len(wanted):
        raise ApiError(400, f"{field}: the video's header counts {header.num_frames} frames but fewer decode",
                       field, "invalid_video")
    return frames


def _header(container: av.container.InputContainer, field: str, max_frame_pixels: int) -> VideoHeader:
    if not container.streams.video:
        raise ApiError(400, f"{field}: the file holds no video stream", field, "invalid_video")
    stream = container.streams.video[0]
    width, height = stream.codec_context.width, stream.codec_context.height
    if width * height > max_frame_pixels:
        raise ApiError(413, f"{field}: frames of {width}x{height} are more than this model's limit of "
                            f"{max_frame_pixels} pixels (param max_video_frame_pixels)", field, "video_too_large")
    rate = stream.average_rate or stream.guessed_rate
    if not rate or width * height == 0:
        raise ApiError(400, f"{field}: the video stream states no frame size or rate", field, "invalid_video")
    count = stream.frames or sum(1 for p in container.demux(stream) if p.size)   # WebM states no count
    if count == 0:
        raise ApiError(400, f"{field}: the video holds no frames", field, "invalid_video")
    return VideoHeader(width, height, count, float(rate))


def _frames(container: av.container.InputContainer, wanted: set[int]) -> list[Image.Image]:
    out = []
    for index, frame in enumerate(container.decode(video=0)):
        if index in wanted:
            out.append(frame.to_image())
        if len(out) == len(wanted):
            break
    return out
