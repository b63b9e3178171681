"""Qwen3-Omni's image and video processor: decoded pictures -> normalised pixels, grids, placeholders.

What the published processor does (transformers' `Qwen2VLImageProcessor`, which Qwen3-Omni's
processor uses for images and, frame by frame, for videos), written here without it:
  * `smart_resize`: both sides rounded to multiples of patch·merge, the area kept within
    [min_pixels, max_pixels] at the same aspect ratio (the vision preset's dims; video frames
    within [video_min_pixels, video_max_pixels], the processor's `videos_kwargs` size);
  * bicubic resize (PIL), rescale by 1/255, normalise with mean = std = 0.5 per channel;
  * a still image is one temporal patch (the encoder repeats it `temporal_patch_size` times);
    a video's frames are padded to a multiple of `temporal_patch_size` by repeating the last
    one (Qwen2-VL's video processor), every frame resized to the first frame's size.
The thinker reads one `<|image_pad|>` / `<|video_pad|>` per merged token (t·h·w / merge²),
between `<|vision_start|>` and `<|vision_end|>`, and places them at 3-D M-RoPE positions
(runtime/models/qwen3_omni/mrope.py) from the item's `VisualGrid`.

Video: a content part `{"type": "video", "video": [frame data URLs], "fps": 2.0}`, frames
already sampled, or `{"type": "video_url", "video_url": {"url": "data:video/mp4;base64,..."}}`
(MP4 or WebM, decoded by runtime/entrypoints/http/video_decode.py, `fps` optional as for frames), whose
frames are sampled as the published video processor samples them (`sample_frames`) and then
take the frame-list path. `fps` is the rate they were sampled at, so a
temporal patch spans `temporal_patch_size / fps` seconds, which the positions scale by
`position_id_per_seconds`; that product must be whole (fps 1, 2, 13 or 26 with the published
numbers) because positions are integers here. Audio inside a video is not supported.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import torch
from PIL import Image

from runtime.conductor.request import MediaInput
from runtime.entrypoints.http.errors import ApiError

MEAN = STD = 0.5          # Qwen3-Omni's image_mean / image_std (all three channels)
MIN_FRAMES, MAX_FRAMES = 4, 768   # Qwen2-VL's video processor (Qwen3-Omni's): frames sampled from a file


@dataclass(frozen=True)
class VisualGrid:
    """One image or video in patches: t temporal patches of h x w patches (before merging)."""

    t: int
    h: int
    w: int
    time_step: int        # M-RoPE positions between temporal patches (0 for a still image)

    def num_tokens(self, merge: int) -> int:
        return self.t * self.h * self.w // merge ** 2


@dataclass(frozen=True)
class VisualInput(MediaInput):
    """A `MediaInput` of processed pixels with the grid its placeholders' positions come from."""

    grid: VisualGrid = field(default=VisualGrid(1, 1, 1, 0))


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) rounded to multiples of `factor` with the area in [min_pixels, max_pixels]."""
    if max(height, width) / min(height, width) > 200:
        raise ApiError(400, f"an image of {width}x{height} is too elongated (aspect ratio above 200)",
                       "messages", "invalid_image")
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


class VisionProcessor:
    """Pictures -> `VisualInput` items for one vision preset (module docstring)."""

    def __init__(self, vision: Mapping[str, Any], pad_ids: tuple[int, int]) -> None:
        self.patch, self.merge = int(vision["patch_size"]), int(vision["spatial_merge_size"])
        self.temporal = int(vision["temporal_patch_size"])
        self.min_pixels, self.max_pixels = int(vision["min_pixels"]), int(vision["max_pixels"])
        self.video_pixels = int(vision["video_min_pixels"]), int(vision["video_max_pixels"])
        self.position_id_per_seconds = float(vision["position_id_per_seconds"])
        self.image_pad, self.video_pad = pad_ids

    def image(self, picture: Image.Image) -> VisualInput:
        size = self._size(picture)
        grid = VisualGrid(1, size[0] // self.patch, size[1] // self.patch, 0)
        return VisualInput(_pixels(picture, size), [self.image_pad] * grid.num_tokens(self.merge), grid)

    def video(self, frames: list[Image.Image], fps: float, field_name: str) -> VisualInput:
        step = self.temporal / fps * self.position_id_per_seconds
        if abs(step - round(step)) > 1e-6:
            raise ApiError(400, f"{field_name}.fps = {fps}: temporal patches of {self.temporal} frames would sit "
                                f"{step:g} positions apart; use an fps that makes this whole (e.g. 1 or 2)",
                           f"{field_name}.fps")
        size = self._size(frames[0], *self.video_pixels)
        frames = frames + [frames[-1]] * (-len(frames) % self.temporal)
        pixels = torch.stack([_pixels(f, size) for f in frames])                        # (F, 3, H, W)
        grid = VisualGrid(len(frames) // self.temporal, size[0] // self.patch, size[1] // self.patch, round(step))
        return VisualInput(pixels, [self.video_pad] * grid.num_tokens(self.merge), grid)

    def sample_frames(self, num_frames: int, video_fps: float, fps: float, field_name: str) -> list[int]:
        """Indices of the frames a video file of `num_frames` at `video_fps` gives at `fps`, as
        transformers' `Qwen2VLVideoProcessor.sample_frames` picks them (whole temporal patches,
        at least MIN_FRAMES and at most MAX_FRAMES, evenly spaced from the first)."""
        t = self.temporal
        most = math.floor(min(MAX_FRAMES, num_frames) / t) * t
        count = min(max(num_frames / video_fps * fps, MIN_FRAMES), most, num_frames)
        count = math.floor(count / t) * t
        if count == 0:
            raise ApiError(400, f"{field_name}: the video has {num_frames} frame(s), fewer than one temporal patch "
                                f"({t} frames)", field_name, "invalid_video")
        return torch.arange(0, num_frames, num_frames / count).int().tolist()

    def _size(self, picture: Image.Image, min_pixels: int | None = None, max_pixels: int | None = None
              ) -> tuple[int, int]:
        """Its resized (H, W): an image's bounds, or those given (a video's frames)."""
        return smart_resize(picture.height, picture.width, self.patch * self.merge,
                            min_pixels or self.min_pixels, max_pixels or self.max_pixels)


def _pixels(picture: Image.Image, size: tuple[int, int]) -> torch.Tensor:
    """(3, H, W) float32: bicubic resize to `size` (H, W), rescale, normalise."""
    resized = picture.convert("RGB").resize((size[1], size[0]), Image.Resampling.BICUBIC)
    array = np.asarray(resized, dtype=np.float32) / 255.0
    return torch.from_numpy((array - MEAN) / STD).permute(2, 0, 1).contiguous()


def grids_param(items: list[tuple[str, Any]]) -> str:
    """The request param `mrope_grids` the thinker executor reads: "t,h,w,step" per visual item, in
    prompt order, joined by ';' (request params travel as scalars)."""
    grids = [v.grid for _, v in items if isinstance(v, VisualInput)]
    return ";".join(f"{g.t},{g.h},{g.w},{g.time_step}" for g in grids)


def parse_grids(text: str) -> list[VisualGrid]:
    return [VisualGrid(*(int(x) for x in part.split(","))) for part in text.split(";") if part]
