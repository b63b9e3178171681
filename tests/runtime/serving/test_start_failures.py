"""A server whose start fails leaves no worker behind, and says why: its port taken, or a worker
without a start step for `--ready-timeout` seconds (real `mstar-run` subprocesses, real workers)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import psutil
import pytest

from tests.runtime.serving.conftest import REPO, compile_plan


def _workers_of(plan: str) -> list[psutil.Process]:
    """Live worker processes serving `plan` (a plan path unique to this test)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if plan in cmd and "worker" in cmd:
            found.append(proc)
    return found


def _run(plan: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runtime.entrypoints.cli", plan, "--log-level", "warning", *flags], cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=180)


def _no_workers_left(plan: str) -> bool:
    deadline = time.monotonic() + 10
    while _workers_of(plan) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not _workers_of(plan)


@pytest.fixture
def plan(tmp_path) -> str:
    return compile_plan(tmp_path, "smollm2", preset="tiny")


def test_a_taken_port_is_said_and_the_workers_go_with_the_server(plan: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        done = _run(plan, "--port", str(taken.getsockname()[1]))
    assert done.returncode != 0
    assert "cannot listen on 127.0.0.1:" in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert _no_workers_left(plan)


def test_a_worker_without_a_start_step_in_time_fails_the_start_naming_it(plan: str) -> None:
    done = _run(plan, "--port", "0", "--ready-timeout", "0.01")    # no worker loads its weights that fast
    assert done.returncode != 0
    assert "rank 0 not ready and without progress" in done.stderr and "--ready-timeout" in done.stderr, \
        done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert _no_workers_left(plan)
