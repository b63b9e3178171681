"""`mstar-run` serves from any working directory: its local workers start with `python -P`, so a
folder named `runtime/` where the user stands (a checkout, a stale copy in /tmp) cannot shadow the
installed package in the worker processes (it used to: each worker died on import and was
restarted forever)."""
from __future__ import annotations

import sys
from pathlib import Path

from tests.runtime.serving.conftest import Server, compile_plan, http


def test_a_runtime_folder_in_the_working_directory_does_not_shadow_the_workers(plan_dir, tmp_path) -> None:
    plan = compile_plan(plan_dir, "smollm2", preset="tiny")
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "__init__.py").write_text('raise SystemExit("the shadowing runtime/ was imported")\n')
    (tmp_path / "runtime" / "cli.py").write_text("")
    entry = Path(sys.executable).with_name("mstar-run")     # the console script, as a user types it
    srv = Server(plan, env={"OMP_NUM_THREADS": "1"}, command=[str(entry)], cwd=tmp_path)
    try:
        srv.wait_ready(120)
        status, out = http("POST", f"{srv.url}/v1/tasks/chat", {"params": {"max_tokens": 2},
                                                               "inputs": [{"type": "tokens", "ids": [1, 2, 3]}]},
                           timeout=120)
        assert status == 200 and len(out["token_ids"]) == 2, out
        assert http("GET", f"{srv.url}/health")[1]["status"] == "ok"
    finally:
        assert srv.stop() == 0
