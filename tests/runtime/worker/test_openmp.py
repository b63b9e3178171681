"""The worker's OpenMP wait policy: idle threads sleep unless the user chose otherwise.

Each case runs in a fresh interpreter: libgomp reads its settings when torch loads, and
this test process has torch loaded already.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PROBE = """
import json, os, sys
from runtime.worker.openmp import passive_waits
changed = passive_waits(os.environ)
import torch
late = passive_waits(dict())        # torch is loaded now: too late, so nothing is set
print(json.dumps([changed, os.environ.get("OMP_WAIT_POLICY"), os.environ.get("GOMP_SPINCOUNT"), late]))
"""


def _probe(env: dict[str, str]) -> list:
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT,
                          env={**base, "PYTHONPATH": str(ROOT), **env}, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("env, expected", [
    ({}, [True, "PASSIVE", None, False]),
    ({"OMP_WAIT_POLICY": "ACTIVE"}, [False, "ACTIVE", None, False]),
    ({"GOMP_SPINCOUNT": "10000"}, [False, None, "10000", False]),
])
def test_idle_openmp_threads_sleep_unless_the_user_chose(env: dict[str, str], expected: list) -> None:
    assert _probe(env) == expected
