"""Byte sizes as people write them: `80GiB`, `512MiB`, `24GB`, or a plain int."""
from __future__ import annotations

import re

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """Bytes in `text`; raises ValueError when it is not a size."""
    if isinstance(text, bool):
        raise ValueError(f"not a size: {text!r}")
    if isinstance(text, int):
        if text <= 0:
            raise ValueError(f"not a positive size: {text}")
        return text
    match = _SIZE.match(str(text))
    if not match:
        raise ValueError(f"not a size: {text!r} (write e.g. 80GiB, 512MiB)")
    value = float(match.group(1)) * _UNITS[(match.group(2) or "").upper()]
    if value < 1:
        raise ValueError(f"not a positive size: {text!r}")
    return int(value)


def format_size(num_bytes: int) -> str:
    """`num_bytes` for people, in binary units: 13.9 GiB."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
