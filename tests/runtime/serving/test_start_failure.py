"""A worker that exits before it is ready fails the server's start at once, with its exit status: it
is not restarted until the ready timeout (it used to be, hundreds of times: a bf16 plan on a CPU
whose oneDNN has no bf16 kernels crashed each worker at load, and the start said only "not ready"
after 300 s). The worker here is a real `mstar-run worker` process that exits as it starts (a
`sitecustomize` on its path, run only in processes whose command line holds `worker`), counting
its starts in a file."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.runtime.serving.conftest import REPO, compile_plan

EXITS = """\
import os, sys
if "worker" in sys.orig_argv:
    with open({starts!r}, "a") as f:
        f.write("started\\n")
    os._exit(3)
"""


def test_a_worker_that_exits_before_ready_fails_the_start_at_once(plan_dir: Path, tmp_path: Path) -> None:
    plan = compile_plan(plan_dir, "smollm2", preset="tiny")
    starts = tmp_path / "starts"
    (tmp_path / "sitecustomize.py").write_text(EXITS.format(starts=str(starts)))
    run = subprocess.run([sys.executable, "-m", "runtime.entrypoints.cli", plan, "--port", "0", "--ready-timeout", "300"],
                         cwd=REPO, env={**os.environ, "PYTHONPATH": f"{tmp_path}:{REPO}", "OMP_NUM_THREADS": "1"},
                         capture_output=True, text=True, timeout=240)
    assert run.returncode != 0
    assert "the worker of rank 0 exited with status 3 before it was ready" in run.stderr, run.stderr[-2000:]
    assert starts.read_text().count("started") == 1       # not restarted, and so not waited on for 300 s
