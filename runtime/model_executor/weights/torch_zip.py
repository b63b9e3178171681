"""Tensors out of a torch.save zip checkpoint (.bin / .pt / .pth) without unpickling it.

A torch.save file is a zip: `<name>/data.pkl` describes the object (pickle protocol 2) and
`<name>/data/<key>` holds each storage's raw bytes. `read_torch_zip` reads data.pkl with its own
small interpreter of the pickle opcodes torch's checkpoints use: containers, numbers, strings,
and a fixed set of names it maps to its own constructors (`collections.OrderedDict`, torch's
`_rebuild_tensor_v2` / `_rebuild_parameter` and the typed storages). Any other name is refused
with an error that names it; nothing is imported and no code from the file runs, so the pickle
module never sees it. Used only by the offline `mstar-run convert-weights`; serving reads the
converted safetensors.
"""
from __future__ import annotations

import struct
import zipfile
from pathlib import Path
from typing import Any, Callable

import torch

STORAGE_DTYPES = {
    "FloatStorage": torch.float32, "DoubleStorage": torch.float64, "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16, "LongStorage": torch.int64, "IntStorage": torch.int32,
    "ShortStorage": torch.int16, "CharStorage": torch.int8, "ByteStorage": torch.uint8, "BoolStorage": torch.bool,
}


class NotAWeightsFile(ValueError):
    """The file is not a torch zip checkpoint of plain tensors and containers."""


class _Mark:
    pass


def _rebuild_tensor(storage: torch.Tensor, offset: int, size: tuple, stride: tuple, *_: Any) -> torch.Tensor:
    return torch.as_strided(storage, size, stride, offset)


def _rebuild_parameter(data: torch.Tensor, *_: Any) -> torch.Tensor:
    return data


def _ordered_dict(*args: Any) -> dict:
    return dict(*args)


_CALLABLES: dict[tuple[str, str], Callable[..., Any]] = {
    ("collections", "OrderedDict"): _ordered_dict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
}


def read_torch_zip(path: Path) -> Any:
    """The object a torch.save zip checkpoint holds, with its tensors (views of their storages)."""
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile as exc:
        raise NotAWeightsFile("not a zip checkpoint (a legacy torch.save file: load and re-save it with a "
                              "recent torch, or convert it elsewhere)") from exc
    with archive:
        pkl = [n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
        if len(pkl) != 1:
            raise NotAWeightsFile("no data.pkl in the archive")
        prefix = pkl[0][:-len("data.pkl")]
        if f"{prefix}byteorder" in archive.namelist() and archive.read(f"{prefix}byteorder") != b"little":
            raise NotAWeightsFile("a big-endian checkpoint")

        def storage(pid: tuple) -> torch.Tensor:
            if len(pid) != 5 or pid[0] != "storage" or not isinstance(pid[1], torch.dtype):
                raise NotAWeightsFile(f"an unknown persistent record {pid[:2]!r}")
            raw = bytearray(archive.read(f"{prefix}data/{pid[2]}"))
            return torch.frombuffer(raw, dtype=pid[1]) if raw else torch.empty(0, dtype=pid[1])

        return _Reader(archive.read(pkl[0]), storage).run()


class _Reader:
    """The pickle opcodes of torch checkpoints, as data only."""

    def __init__(self, data: bytes, storage: Callable[[tuple], torch.Tensor]) -> None:
        self.data, self.pos, self.storage = data, 0, storage
        self.stack: list[Any] = []
        self.memo: dict[int, Any] = {}

    def _take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise NotAWeightsFile("data.pkl ends early")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def _unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self._take(struct.calcsize(fmt)))[0]

    def _line(self) -> str:
        end = self.data.index(b"\n", self.pos)
        out, self.pos = self.data[self.pos:end].decode("utf-8"), end + 1
        return out

    def _since_mark(self) -> list[Any]:
        i = max(i for i, x in enumerate(self.stack) if isinstance(x, _Mark))
        items, self.stack[i:] = self.stack[i + 1:], []
        return items

    def run(self) -> Any:
        push, pop = self.stack.append, self.stack.pop
        while True:
            op = self._take(1)
            if op == b".":                                           # STOP
                return pop()
            if op == b"\x80":                                        # PROTO
                self._take(1)
            elif op == b"\x95":                                      # FRAME
                self._take(8)
            elif op == b"(":                                         # MARK
                push(_Mark())
            elif op == b"}":
                push({})
            elif op == b"]":
                push([])
            elif op == b")":
                push(())
            elif op == b"t":
                push(tuple(self._since_mark()))
            elif op in (b"\x85", b"\x86", b"\x87"):                  # TUPLE1..3
                n = op[0] - 0x84
                items = self.stack[-n:]
                del self.stack[-n:]
                push(tuple(items))
            elif op == b"a":                                         # APPEND
                item = pop()
                self.stack[-1].append(item)
            elif op == b"e":                                         # APPENDS
                items = self._since_mark()
                self.stack[-1].extend(items)
            elif op == b"s":                                         # SETITEM
                value, key = pop(), pop()
                self.stack[-1][key] = value
            elif op == b"u":                                         # SETITEMS
                items = self._since_mark()
                self.stack[-1].update(zip(items[::2], items[1::2]))
            elif op == b"J":
                push(self._unpack("<i"))
            elif op == b"K":
                push(self._unpack("<B"))
            elif op == b"M":
                push(self._unpack("<H"))
            elif op == b"\x8a":                                      # LONG1
                push(int.from_bytes(self._take(self._unpack("<B")), "little", signed=True))
            elif op == b"G":
                push(self._unpack(">d"))
            elif op in (b"X", b"\x8c", b"\x8d"):                     # BINUNICODE, SHORT_, 8
                size = self._unpack({b"X": "<I", b"\x8c": "<B", b"\x8d": "<Q"}[op])
                push(self._take(size).decode("utf-8"))
            elif op in (b"C", b"B"):                                 # SHORT_BINBYTES, BINBYTES
                push(bytes(self._take(self._unpack("<B" if op == b"C" else "<I"))))
            elif op == b"N":
                push(None)
            elif op in (b"\x88", b"\x89"):                           # NEWTRUE, NEWFALSE
                push(op == b"\x88")
            elif op in (b"q", b"r"):                                 # BINPUT, LONG_BINPUT
                self.memo[self._unpack("<B" if op == b"q" else "<I")] = self.stack[-1]
            elif op == b"\x94":                                      # MEMOIZE
                self.memo[len(self.memo)] = self.stack[-1]
            elif op in (b"h", b"j"):                                 # BINGET, LONG_BINGET
                push(self.memo[self._unpack("<B" if op == b"h" else "<I")])
            elif op == b"c":                                         # GLOBAL
                push(self._global(self._line(), self._line()))
            elif op == b"Q":                                         # BINPERSID
                push(self.storage(pop()))
            elif op == b"R":                                         # REDUCE
                args, fn = pop(), pop()
                if not callable(fn) or isinstance(fn, torch.dtype):
                    raise NotAWeightsFile(f"a call of {fn!r}")
                push(fn(*args))
            elif op == b"b":                                         # BUILD: state of an object (ignored)
                pop()
            else:
                raise NotAWeightsFile(f"pickle opcode {op!r} at byte {self.pos - 1}, which a checkpoint "
                                      "of tensors does not use")

    @staticmethod
    def _global(module: str, name: str) -> Any:
        if module == "torch" and name in STORAGE_DTYPES:
            return STORAGE_DTYPES[name]
        if (module, name) in _CALLABLES:
            return _CALLABLES[(module, name)]
        raise NotAWeightsFile(f"it names {module}.{name}, which a checkpoint of tensors does not need")
