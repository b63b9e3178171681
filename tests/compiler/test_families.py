"""Model families: one `Family` per family, built-ins first, then plugins (entry-point group
mstar.families); declaring them imports neither torch nor the runtime."""
from __future__ import annotations

import subprocess
import sys

import pytest

from compiler_helpers import REPO
from mstar_compiler.catalogue import BUILTIN_FAMILIES, Family, KindSpec, Port, load_catalogue, load_families

GAIN = KindSpec(kind="gain", doc="a gain", inputs=(Port("audio", "audio", ("S",)),),
                outputs=(Port("audio", "audio", ("S",)),), presets={"tiny": {}}, num_params=lambda dims: 1)


def test_a_family_names_one_component_class_per_kind() -> None:
    with pytest.raises(ValueError, match="family 'toy'.*no class for gain"):
        Family("toy", (GAIN,), components={})
    with pytest.raises(ValueError, match="family 'toy'.*classes for kinds it does not define: echo"):
        Family("toy", (GAIN,), components={"gain": "toy:Gain", "echo": "toy:Echo"})


def test_families_are_the_builtins_then_the_installed_plugin() -> None:
    families = load_families()
    assert list(families)[:len(BUILTIN_FAMILIES)] == list(BUILTIN_FAMILIES)
    assert "audio_gain" in families      # tests/plugins/mstar_audio_gain, installed by `make venv-test`
    catalogue = load_catalogue()
    for family in families.values():
        assert all(catalogue[spec.kind].family == family.name for spec in family.kinds)


def test_declaring_the_families_imports_neither_torch_nor_the_runtime() -> None:
    code = ("import sys\n"
            "from mstar_compiler.catalogue import load_catalogue, load_families\n"
            "load_families(), load_catalogue()\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n"
            "assert not [m for m in sys.modules if m.split('.')[0] == 'runtime'], 'the runtime was imported'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
