"""Suite registry, the CLI (list, render, unknown suite) and the server launcher."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import bench.registry as registry
from bench.registry import Needs, SUITE_ORDER, register, suites
from bench.results import Row, RunRecord, Side, write
from bench.servers import Server, free_port
from bench.stats import LOWER

ROOT = Path(__file__).resolve().parents[2]


def test_every_issue_suite_is_registered_in_order():
    assert list(suites()) == list(SUITE_ORDER) == ["chat", "rollout", "cfg", "tts", "stack", "sched", "linear", "kernels",
                                                      "speech", "prefix", "bound", "bound-3b", "threads", "network",
                                                      "realtime", "prefill", "attention", "quant", "orpheus-3b", "vjepa2-g",
                                                      "omni-wide", "bagel-wide", "structured", "cascade",
                                                      "whisper", "dit", "pi05"]
    with pytest.raises(ValueError, match="twice"):
        register("chat", "again")(lambda ctx: [])


def test_chat_jobs_force_16_lengths_over_64_to_256():
    from bench.suite_chat import jobs
    work = jobs(quick=False)
    lengths = [j.max_tokens for j in work]
    assert len(work) == 16 and lengths[0] == 64 and lengths[-1] == 256 and lengths == sorted(lengths)
    assert len({j.prompt for j in work}) == 16


def _bench(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "tools/bench.py"), *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def test_cli_lists_suites_and_rejects_unknown_ones():
    listed = _bench("--list")
    assert listed.returncode == 0 and all(s in listed.stdout for s in SUITE_ORDER)
    bad = _bench("warp")
    assert bad.returncode == 2 and "unknown suite" in bad.stderr


def test_cli_render_rebuilds_the_table_and_plots_from_saved_json(tmp_path):
    row = Row("H=4", "rollout time", "s", LOWER, Side("cached", [1.0, 1.1]), Side("native", [2.0, 2.4]),
              plot="t", x=4)
    write(RunRecord("rollout", "V-JEPA", "python tools/bench.py rollout", 2, "2026-01-01T00:00:00+00:00",
                    rows=[row]), tmp_path)
    done = _bench("--render", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    table = (tmp_path / "latest.md").read_text()
    assert table in done.stdout
    assert "| H=4 |" in table and "mstar ahead" in table
    if importlib.util.find_spec("matplotlib") is not None:
        assert "![rollout](plots/rollout-t.png)" in table and (tmp_path / "plots/rollout-t.png").is_file()


def _cli_module():
    spec = importlib.util.spec_from_file_location("bench_main", ROOT / "tools/bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_missing_part_becomes_a_needs_entry_not_a_number(monkeypatch):
    def missing(ctx):
        raise Needs("the conductor")

    registry.suites()      # every suite module imported first: importing sched's later would register it again
    monkeypatch.setitem(registry._SUITES, "sched", registry.Suite("sched", "t", missing))
    cli = _cli_module()
    record = cli.run_suite("sched", cli.parse_args(["sched", "--rounds", "1"]), "cmd")
    assert record.rows == [] and record.needs == [{"case": "all cases", "needs": "the conductor"}]


def test_server_starts_answers_and_is_stopped(tmp_path):
    port = free_port()
    cmd = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)]
    with Server("http.server", cmd, port, tmp_path / "log.txt", health_path="/", start_timeout_s=60) as srv:
        assert srv.url.endswith(str(port))
        proc = srv.proc
    assert proc.poll() is not None


def test_mstar_run_server_binds_its_own_port_and_says_which(tmp_path):
    """The bench's mstar-run binds a port the system picks and writes it down once serving: no
    port is chosen here and bound there (module docstring of tools/bench/servers.py)."""
    from bench.servers import mstar_run
    from tests.runtime.serving.conftest import compile_plan, http
    plan = compile_plan(tmp_path, "smollm2", preset="tiny")
    with mstar_run(Path(plan), tmp_path / "mstar.log", "mstar-run tiny", 1, start_timeout_s=120) as srv:
        assert "--port-file" in srv.cmd and srv.cmd[srv.cmd.index("--port") + 1] == "0"
        assert srv.port > 0 and srv.port == int((tmp_path / "mstar.port").read_text())
        assert http("GET", srv.url + "/health")[0] == 200
        proc = srv.proc
    assert proc.poll() is not None


def test_servers_start_without_the_openmp_policy_bench_sets_for_itself(tmp_path):
    """bench.py sets a worker's wait policy for its in-process sides; a peer server (vLLM) must start with its
    own defaults, so the variable is not in the environment the server process sees."""
    out = tmp_path / "env.txt"
    code = f"import os, pathlib; pathlib.Path({str(out)!r}).write_text(os.environ.get('GOMP_SPINCOUNT', '-'))"
    port = free_port()
    script = (f"{code}\nimport http.server, socketserver\n"
              f"socketserver.TCPServer(('127.0.0.1', {port}), http.server.SimpleHTTPRequestHandler).serve_forever()")
    from bench import servers
    old = set(servers.BENCH_SET)
    servers.BENCH_SET.add("GOMP_SPINCOUNT")
    os.environ["GOMP_SPINCOUNT"], before = "100000", os.environ.get("GOMP_SPINCOUNT")
    try:
        with Server("probe", [sys.executable, "-c", script], port, tmp_path / "log.txt", health_path="/",
                    start_timeout_s=60):
            assert out.read_text() == "-"
    finally:
        servers.BENCH_SET.clear()
        servers.BENCH_SET.update(old)
        if before is None:
            os.environ.pop("GOMP_SPINCOUNT")
        else:
            os.environ["GOMP_SPINCOUNT"] = before


def test_server_that_dies_is_reported_with_its_log(tmp_path):
    cmd = [sys.executable, "-c", "import sys; print('no weights here'); sys.exit(3)"]
    with pytest.raises(Needs, match="exited with 3.*no weights here"):
        with Server("broken", cmd, free_port(), tmp_path / "log.txt", start_timeout_s=30):
            pass


def test_fp32_export_is_only_complete_with_config_weights_and_tokenizer(tmp_path):
    from bench.smollm2_fp32 import is_exported
    for name in ("config.json", "model.safetensors"):
        (tmp_path / name).write_text("{}")
        assert not is_exported(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{}")
    assert is_exported(tmp_path)
