"""Speech and rollout models served by real `mstar-run` processes (tiny presets, seeded weights).

One server per model and placement, module-scoped. Workers run torch on one thread: on a
shared 2-core machine a second OpenMP thread spin-waits and a tiny forward takes
milliseconds instead of microseconds (OMP_NUM_THREADS is passed on to the workers).
"""
from __future__ import annotations

from typing import Iterator

import pytest

from tests.runtime.serving.conftest import Server, serve_tiny

ORPHEUS, OMNI, VJEPA = "orpheus-3b", "qwen3-omni-30b-a3b", "vjepa2-ac-vitg"


def serve(tmp_path_factory: pytest.TempPathFactory, graph: str, placement: str = "single") -> Iterator[Server]:
    yield from serve_tiny(tmp_path_factory, graph, placement)


@pytest.fixture(scope="session")
def omni_single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One Qwen3-Omni tiny server for the input tests (audio, images): neither reads counters, so
    sharing it saves a server start (~20 s on 2 cores). Session-scoped: the suite runs its modules in
    a random order, and a package-scoped server would start again each time the order re-enters the package."""
    yield from serve(tmp_path_factory, "qwen3_omni", "single")
