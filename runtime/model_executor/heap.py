"""Handing freed heap pages back to the OS while a rank loads its weights.

glibc keeps freed chunks below its mmap threshold mapped (the threshold grows to 32 MB as large blocks are
freed), so the fp32 parts of a bf16 model freed as it is cast, its random draws and the dense weights its packing
replaced stay resident until trimmed, and would count against the memory plan (what that cost BAGEL and π0.5:
docs/benchmark-log.md). Elsewhere than glibc there is nothing to call.
"""
from __future__ import annotations

import ctypes
import functools

TRIM_AFTER = 8 << 20     # bytes freed at once (a cast's fp32 weight, a packed linear's dense one) worth a trim


def release_freed_memory() -> None:
    """Return the heap's free pages to the OS (`malloc_trim(0)`)."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim(0)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None
