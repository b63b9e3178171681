"""`video_url` parts: an MP4 / WebM file written here with PyAV, sampled as the published video
processor samples it, gives the thinker the same input as the frame-list path given those frames;
its limits (frames sampled, pixels per frame) and undecodable files are 4xx before any work.

The published sampler is transformers' `Qwen2VLVideoProcessor.sample_frames` (Qwen3-Omni's video
processor); its module imports torchvision (not installed here), so the function is compiled from
transformers' own source file and called as is."""
from __future__ import annotations

import ast
import base64
import io
import math
from pathlib import Path
from types import SimpleNamespace

import av
import numpy as np
import pytest
import torch
import transformers
from PIL import Image

from mstar_compiler.pipeline import Options, compile_file
from runtime.entrypoints.http.chat_inputs import chat_inputs_for
from runtime.entrypoints.http.errors import ApiError
from runtime.text import ByteTokenizer
from tests.runtime.models.qwen3_omni.test_image_chat_parity import VISION, image_part


def published_sample_frames():
    """transformers' Qwen2VLVideoProcessor.sample_frames, compiled from its source file."""
    path = Path(transformers.__file__).parent / "models" / "qwen2_vl" / "video_processing_qwen2_vl.py"
    tree = ast.parse(path.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Qwen2VLVideoProcessor")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "sample_frames")
    namespace = {"math": math, "torch": torch, "VideoMetadata": object, "Optional": object}
    exec(compile(ast.Module([fn], []), str(path), "exec"), namespace)
    # the class defaults Qwen3-Omni keeps (min/max frames, temporal patch), sampling at 2 fps
    self = SimpleNamespace(num_frames=None, fps=2.0, temporal_patch_size=VISION["temporal_patch_size"],
                           min_frames=4, max_frames=768)
    return lambda total, video_fps, fps: namespace["sample_frames"](
        self, SimpleNamespace(total_num_frames=total, fps=video_fps), fps=fps).tolist()


def video_file(num_frames: int, fps: int, height: int, width: int, fmt: str = "mp4") -> bytes:
    """A video of random frames (libx264 in MP4, VP8 in WebM: the WebM header counts no frames)."""
    buf, rng = io.BytesIO(), np.random.default_rng(num_frames)
    with av.open(buf, mode="w", format=fmt) as container:
        stream = container.add_stream("libx264" if fmt == "mp4" else "libvpx", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for _ in range(num_frames):
            frame = av.VideoFrame.from_ndarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return buf.getvalue()


def decoded_frames(data: bytes, fmt: str) -> list[Image.Image]:
    with av.open(io.BytesIO(data), format=fmt) as container:
        return [frame.to_image() for frame in container.decode(video=0)]


def video_url_part(data: bytes, fmt: str, **extra) -> dict:
    return {"type": "video_url", "video_url": {"url": f"data:video/{fmt};base64," + base64.b64encode(data).decode()},
            **extra}


@pytest.fixture(scope="module")
def processor():
    return chat_inputs_for(compile_file("graphs/qwen3_omni.yaml", Options(preset="tiny", placement="single")).plan)


def items_of(processor, part: dict) -> list:
    return processor.chat_items([{"role": "user", "content": [part, {"type": "text", "text": "?"}]}], ByteTokenizer())


@pytest.mark.parametrize("total, video_fps, fps", [(10, 5, 2), (3, 30, 2), (7, 24, 2), (90, 30, 1), (5, 1, 2),
                                                   (2000, 25, 2), (61, 29.97, 1.5)])
def test_frames_are_sampled_as_the_published_processor_samples_them(processor, total, video_fps, fps) -> None:
    want = published_sample_frames()(total, video_fps, fps)
    assert processor.vision.sample_frames(total, video_fps, fps, "v") == want


@pytest.mark.parametrize("fmt", ["mp4", "webm"])
def test_a_video_file_reads_as_its_sampled_frames(processor, fmt) -> None:
    data = video_file(10, 5, 32, 48, fmt)
    indices = published_sample_frames()(10, 5, 2.0)
    assert indices == [0, 2, 5, 7]
    frames = decoded_frames(data, fmt)
    frame_list = {"type": "video", "fps": 2.0, "video": [image_part(frames[k])["image_url"]["url"] for k in indices]}
    got, want = items_of(processor, video_url_part(data, fmt)), items_of(processor, frame_list)
    assert [(d, v if d == "text" else v.tokens) for d, v in got] == [(d, v if d == "text" else v.tokens) for d, v in want]
    assert got[1][1].grid == want[1][1].grid and got[1][1].grid.t == 2
    assert torch.equal(got[1][1].value, want[1][1].value)          # the same pixels, bit for bit
    assert processor.request_params(got) == processor.request_params(want)


@pytest.mark.parametrize("part, status, code", [
    (video_url_part(video_file(45, 5, 32, 32), "mp4"), 413, "video_too_long"),     # 18 sampled > 8 (tiny)
    (video_url_part(video_file(4, 5, 144, 128), "mp4"), 413, "video_too_large"),   # > 16384 pixels a frame
    (video_url_part(b"\x00\x00\x00\x18ftypmp42 not a movie", "mp4"), 400, "invalid_video"),
    (video_url_part(video_file(4, 5, 32, 32), "mp4", use_audio_in_video=True), 400, "unsupported_input"),
    ({"type": "video_url", "video_url": {"url": "data:video/x-msvideo;base64,AAAA"}}, 400, "invalid_video"),
    ({"type": "video_url", "video_url": {"url": "https://example.com/cat.mp4"}}, 400, "invalid_video"),
    (video_url_part(video_file(1, 5, 32, 32), "mp4"), 400, "invalid_video"),         # not one temporal patch
])
def test_bad_video_files_are_4xx_before_any_work(processor, part, status, code) -> None:
    with pytest.raises(ApiError) as info:
        items_of(processor, part)
    assert info.value.status == status and info.value.code == code and info.value.message
