"""plan.bin: round trip, determinism, and refusal of corrupt or foreign files."""
from __future__ import annotations

import struct

import pytest

from compiler_helpers import HERE, compile_toy
from mstar_compiler import plan

TOY = (HERE / "graphs" / "toy.yaml").read_text()


def test_round_trip_and_determinism(tmp_path):
    first = compile_toy(TOY, placement="split")
    second = compile_toy(TOY, placement="split")
    assert first.data == second.data
    path = tmp_path / "toy.plan.bin"
    path.write_bytes(first.data)
    loaded = plan.load_plan(path)
    assert loaded == first.plan
    assert first.data[:8] == plan.MAGIC


def test_different_input_gives_different_bytes():
    a = compile_toy(TOY).data
    b = compile_toy(TOY.replace("default: 16", "default: 17")).data
    assert a != b


@pytest.mark.parametrize("offset", [0, 9, 20, 60, -1])
def test_flipped_byte_is_refused(tmp_path, offset):
    data = bytearray(compile_toy(TOY).data)
    data[offset] ^= 0x01
    path = tmp_path / "bad.bin"
    path.write_bytes(bytes(data))
    with pytest.raises(plan.PlanFormatError) as info:
        plan.load_plan(path)
    assert str(path) in str(info.value)
    assert any(word in str(info.value) for word in ("magic", "version", "checksum"))


def test_wrong_version_is_refused_with_versions_named():
    data = compile_toy(TOY).data
    bumped = data[:8] + struct.pack("<I", plan.FORMAT_VERSION + 1) + data[12:]
    with pytest.raises(plan.PlanFormatError, match=rf"version {plan.FORMAT_VERSION + 1}.*reads version"):
        plan.loads_plan(bumped)


@pytest.mark.parametrize("data", [b"", b"MSTARPLN", b"not a plan at all, sorry" * 3])
def test_garbage_is_refused(data):
    with pytest.raises(plan.PlanFormatError):
        plan.loads_plan(data)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(plan.PlanFormatError, match="cannot read plan"):
        plan.load_plan(tmp_path / "absent.bin")


def test_no_pickle_in_payload():
    data = compile_toy(TOY).data
    assert b"\x80\x04\x95" not in data[:64]           # pickle protocol 4 header
    assert plan.loads_plan(data).model == "toy"
