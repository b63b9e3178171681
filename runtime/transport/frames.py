"""Tensors as raw buffer frames: a (dtype, shape) header in the message, the bytes beside it.

Sending hands ZeroMQ the tensor's own memory (no copy for contiguous CPU tensors);
receiving wraps the frame's buffer with `torch.frombuffer` (no copy either). The
header travels inside the typed control message (`TensorMeta`), so a multipart ZeroMQ
message is `[msgpack envelope, frame 0, frame 1, ...]`.
"""
from __future__ import annotations

import msgspec
import torch

# Wire names of the dtypes we move; anything else is a programming error, not a user error.
_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_NAMES = {v: k for k, v in _DTYPES.items()}


class TensorMeta(msgspec.Struct, frozen=True, array_like=True):
    """Header of one tensor frame."""

    name: str                # what the tensor is: a port name ("token", "image") or a value key
    dtype: str               # one of _DTYPES, e.g. "float32"
    shape: tuple[int, ...]   # tensor shape; the frame holds prod(shape) * itemsize bytes


def tensor_to_frame(name: str, tensor: torch.Tensor) -> tuple[TensorMeta, memoryview]:
    """Header and a buffer view of `tensor` (moved to CPU and made contiguous if needed)."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    meta = TensorMeta(name, _NAMES[t.dtype], tuple(t.shape))
    if t.numel() == 0:
        return meta, memoryview(b"")
    # raw bytes (bfloat16 has no buffer-protocol format, so never go through numpy's dtype)
    return meta, memoryview(t.reshape(-1).view(torch.uint8).numpy())


class BadFrame(ValueError):
    """A frame does not hold what its header says (a peer's bug or a forged message)."""


def frame_to_tensor(meta: TensorMeta, buffer: memoryview | bytes) -> torch.Tensor:
    """The tensor a frame holds; shares the frame's memory (read-only buffers are copied once).
    The header must name a known dtype and a shape whose bytes are exactly the frame's, so a
    header can never make the receiver allocate more than the sender sent."""
    dtype = _DTYPES.get(meta.dtype)
    if dtype is None:
        raise BadFrame(f"tensor {meta.name!r}: unknown dtype {meta.dtype!r}")
    if any(d < 0 for d in meta.shape):
        raise BadFrame(f"tensor {meta.name!r}: negative dimension in {meta.shape}")
    numel = 1
    for d in meta.shape:
        numel *= d
    if numel * dtype.itemsize != len(buffer):
        raise BadFrame(f"tensor {meta.name!r}: {meta.dtype}{list(meta.shape)} needs {numel * dtype.itemsize} "
                       f"bytes, the frame has {len(buffer)}")
    if len(buffer) == 0:
        return torch.empty(meta.shape, dtype=dtype)
    view = memoryview(buffer)
    if view.readonly:
        view = memoryview(bytearray(view))
    return torch.frombuffer(view, dtype=dtype).reshape(meta.shape)
