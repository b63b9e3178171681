"""tools/check_tolerances.py: every float tolerance in tests/ gives its reason, and the checker finds one that does not."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import check_tolerances

TOOL = Path(check_tolerances.__file__)


def _bare(tmp_path: Path, source: str) -> list[int]:
    path = tmp_path / "test_snippet.py"
    path.write_text(source)
    return [site.line for site in check_tolerances.Checker().bare(path)[1]]


def _count(tmp_path: Path, source: str) -> int:
    path = tmp_path / "test_snippet.py"
    path.write_text(source)
    return check_tolerances.Checker().bare(path)[0]


def test_every_tolerance_in_the_suite_has_its_reason() -> None:
    done = subprocess.run([sys.executable, str(TOOL)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith(" without a reason") and ", 0 without" in done.stdout, done.stdout


def test_a_bare_tolerance_is_named_and_fails_the_run(tmp_path: Path) -> None:
    path = tmp_path / "test_bare.py"
    path.write_text("import torch\n\ndef test_x(a, b):\n    torch.testing.assert_close(a, b, atol=1e-4, rtol=0)\n")
    done = subprocess.run([sys.executable, str(TOOL), str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert f"{path}:4: atol=1e-4 in assert_close" in done.stdout, done.stdout
    assert done.stdout.strip().endswith("1 float tolerances, 1 without a reason")


def test_each_kind_of_site_is_found_when_bare(tmp_path: Path) -> None:
    source = (
        "import math, numpy as np, pytest, torch\n"
        "def _close(a, b, rtol=1e-4):\n"                                   # 2: a helper's float default
        "    return (a - b).abs().max() <= rtol * b.abs().max()\n"         # its bound: passed to the default
        "def test_x(a, b, x):\n"
        "    assert torch.allclose(a, b)\n"                                # 5: library defaults are a tolerance
        "    np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)\n"        # 6
        "    assert math.isclose(x, 0.5, abs_tol=1e-9)\n"                  # 7
        "    assert x == pytest.approx(0.1)\n"                             # 8
        "    assert _close(a, b, rtol=1e-5)\n"                             # 9: a helper's tolerance argument
        "    assert _close(a, b, 1e-5)\n"                                  # 10: by position
        "    assert abs(x - 0.5) < 1e-3\n"                                 # 11: a bound on a difference
        "    assert (a - b).abs().max() <= 2e-2 * b.abs().max()\n"         # 12
        "    assert 1e-3 > abs(x)\n"                                       # 13: written the other way round
    )
    assert _bare(tmp_path, source) == [2, 5, 6, 7, 8, 9, 10, 11, 12, 13]


def test_what_is_not_a_tolerance_is_not_counted(tmp_path: Path) -> None:
    source = (
        "import random, torch\n"
        "def test_x(a, b, n, rng):\n"
        "    torch.testing.assert_close(a, b, rtol=0, atol=0)\n"           # bit equality
        "    assert torch.equal(a, b)\n"
        "    assert rng.random() < 0.5\n"                                  # a draw, not a difference
        "    assert 0.4 * n < len(a) < 0.7 * n\n"
        "    assert abs(len(a) - len(b)) <= 1\n"                           # an integer bound
        "    assert (a - b).abs().max() > 1e-3\n"                          # a lower bound: the difference must show
    )
    assert _count(tmp_path, source) == 0


def test_a_reason_beside_above_or_at_the_name_is_accepted(tmp_path: Path) -> None:
    source = (
        "import pytest, torch\n"
        "# fp32 eps 1.2e-7 x ~500 accumulations over hidden 576: 6e-5; measured max 1.4e-5\n"
        "FP32_ATOL = 1e-4\n"
        "LOOSE = 1e-2\n"                                                   # 4: a constant without its reason
        "# bf16 rounds each output once: 2^-8 relative\n"
        "@pytest.mark.parametrize('dtype, tol', [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])\n"
        "def test_x(a, b, dtype, tol):\n"
        "    torch.testing.assert_close(a, b, atol=FP32_ATOL, rtol=0)\n"
        "    torch.testing.assert_close(a, b, atol=tol * 10, rtol=tol)\n"
        "    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)  # a few fp32 ulps, measured 2e-7\n"
        "    # summation order only: measured exact\n"
        "    torch.testing.assert_close(a, b,\n"
        "                               atol=1e-6, rtol=0)\n"
        "    torch.testing.assert_close(a, b, atol=LOOSE, rtol=0)\n"       # 14: bare through its constant
        "    scale = 1e-3\n"                                               # a local: its own line needs the reason
        "    assert (a - b).abs().max() < scale\n"                         # 16
        "    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)  # close enough\n"   # 17: a comment, no reason
        "    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)  # the background\n"  # 18: 'round' inside a word
    )
    assert _bare(tmp_path, source) == [14, 16, 17, 18]


def test_a_constant_imported_from_another_test_module_is_read_where_it_is_defined(tmp_path: Path) -> None:
    """A name imported from tests.* is followed to its definition in the repository: bare there, bare here."""
    source = ("import torch\nfrom tests.runtime.models.decoder_lm.test_lm_parity import ATOL\n"
              "def test_x(a, b):\n    torch.testing.assert_close(a, b, atol=ATOL, rtol=0)\n")
    assert _bare(tmp_path, source) == []      # test_lm_parity.ATOL carries its reason
