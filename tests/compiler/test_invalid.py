"""The invalid-graph corpus: each file in tests/compiler/invalid/ pins its CompileError.

Header of each file:
    # expect: LINE:COL: part of the message | part of the hint   (hint part optional)
    # options: devices=2 device_memory=8GiB placement=NAME preset=NAME   (optional)
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from compiler_helpers import HERE
from mstar_compiler.errors import CompileError
from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from mstar_compiler.units import parse_size

CORPUS = sorted((HERE / "invalid").glob("*.yaml"))
_EXPECT = re.compile(r"^# expect: (\d+):(\d+): (.*?)(?: \| (.*))?$")


def _header(path: Path) -> tuple[tuple[int, int, str, str | None], Options]:
    lines = path.read_text().splitlines()
    match = _EXPECT.match(lines[0]) if lines else None
    assert match, f"{path.name}: first line must be '# expect: LINE:COL: message [| hint]'"
    options: dict = {}
    if len(lines) > 1 and lines[1].startswith("# options:"):
        for item in lines[1].split(":", 1)[1].split():
            key, value = item.split("=")
            options[key] = parse_size(value) if key == "device_memory" else int(value) if key == "devices" else value
    return (int(match[1]), int(match[2]), match[3], match[4]), Options(**options)


def test_corpus_is_large_enough():
    assert len(CORPUS) >= 40


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_invalid_graph_reports_exact_error(path: Path):
    (line, col, message, hint), options = _header(path)
    with pytest.raises(CompileError) as info:
        compile_file(str(path), options, verify=True)
    err = info.value
    assert (err.position.line, err.position.column) == (line, col), str(err)
    assert err.position.file == str(path)
    assert message in err.message, str(err)
    if hint is not None:
        assert hint in err.hint, str(err)
    assert str(err).startswith(f"{path}:{line}:{col}: error: ")
