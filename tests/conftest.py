"""Suite-wide set-up.

Triton kernels run on CPU tensors through the interpreter, which must be switched on
before any kernel module is imported; on a machine with a CUDA device they compile for
real. Tests marked `gpu` are skipped without a CUDA device; tests marked `slow` (real-size models: minutes
and many GiB each) run only with `--slow`, each beside a CI-sized test of the same code. The suite runs in a random order
(pytest-randomly); the seed is printed at the end, even under -q, so a failure can be rerun in
the same order (`pytest --randomly-seed=N`; `-p no:randomly` runs it in file order).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# the benchmarks' reference sides (bench.vjepa2_meta, bench.omni_hf_config) are the parity tests' oracles too
TOOLS = Path(__file__).resolve().parents[1] / "tools"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

HAS_CUDA_DEVICE = os.path.exists("/dev/nvidiactl")

if not HAS_CUDA_DEVICE:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow", action="store_true", help="also run the tests marked slow (real-size models)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_gpu = pytest.mark.skip(reason="needs a CUDA device")
    no_slow = pytest.mark.skip(reason="a real-size model: run with --slow")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA_DEVICE:
            item.add_marker(no_gpu)
        if "slow" in item.keywords and not config.getoption("--slow"):
            item.add_marker(no_slow)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    seed = getattr(config.option, "randomly_seed", None)
    if seed is not None:
        terminalreporter.write_line(f"random test order: rerun it with --randomly-seed={seed}")
