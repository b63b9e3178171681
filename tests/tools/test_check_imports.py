"""tools/check_imports.py: the project's own imports hold its layers, and the checker finds what breaks them."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import check_imports

TOOL = Path(check_imports.__file__)


def test_the_project_has_no_circle_and_no_upward_import() -> None:
    done = subprocess.run([sys.executable, str(TOOL)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith(": 0 circles, 0 imports against the layers"), done.stdout


def test_a_circle_is_found_with_its_members_only() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}   # d leads into the circle, not in it
    assert check_imports.circles(graph) == [["a", "b", "c"]]
    assert check_imports.circles({"a": {"b"}, "b": set()}) == []


def test_upward_imports_family_imports_and_unplaced_modules_are_named() -> None:
    graph = {
        "runtime.worker.loader": {"runtime.conductor.request", "runtime.model_executor.layers"},   # one up, one down
        "runtime.conductor.scheduler": {"runtime.models.bagel.executors"},     # a family is found by name only
        "runtime.models.bagel.executors": {"runtime.worker.executors"},        # a family may import any layer
        "runtime.launch.server": {"runtime.conductor.request"},                # launchers import none of mstar
        "runtime.gadgets": set(),                                              # a package in no layer
    }
    found = check_imports.upward(graph)
    assert len(found) == 4, found
    assert found[0].startswith("runtime.conductor.scheduler -> runtime.models.bagel.executors")
    assert found[1].startswith("runtime.gadgets: in no layer")
    assert found[2].startswith("runtime.launch.server -> runtime.conductor.request")
    assert found[3] == ("runtime.worker.loader -> runtime.conductor.request: worker imports conductor, "
                        "a layer above it")


def test_imports_are_read_from_every_form(tmp_path: Path) -> None:
    """Relative, function-level and TYPE_CHECKING imports all count; `from pkg import module` names the module."""
    for name in ("pkg/__init__.py", "pkg/a.py", "pkg/b.py", "pkg/c.py", "pkg/sub/__init__.py", "pkg/sub/d.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    (tmp_path / "pkg/a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n"
        "def f():\n    from . import c\n    from .sub import d\n")
    known = {"pkg": tmp_path / "pkg/__init__.py", "pkg.a": tmp_path / "pkg/a.py", "pkg.b": tmp_path / "pkg/b.py",
             "pkg.c": tmp_path / "pkg/c.py", "pkg.sub": tmp_path / "pkg/sub/__init__.py",
             "pkg.sub.d": tmp_path / "pkg/sub/d.py"}
    assert check_imports.imported("pkg.a", known["pkg.a"], known) == {"pkg.b", "pkg.c", "pkg.sub.d"}
