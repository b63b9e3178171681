"""A plugin package's kind *and executor* served end to end by `mstar-run`, with no line of
mstar naming them: tests/plugins/mstar_audio_gain adds the kind `audio_gain` (catalogue +
module) and its executor (a fade-in that keeps per-request state across a stream's Runs)
through entry points; tests/compiler/graphs/plugin_tts.yaml puts it after SNAC."""
from __future__ import annotations

import base64
import threading
from pathlib import Path

import numpy as np
import pytest
import yaml

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from tests.runtime.serving.conftest import REPO, Server, http

GRAPH = REPO / "tests" / "compiler" / "graphs" / "plugin_tts.yaml"
BODY = {"params": {"max_tokens": 70, "temperature": 0.0, "gain": 1.5}, "inputs": [{"type": "tokens", "ids": [5, 6, 7]}]}


def _without_gain(body: dict) -> dict:
    """`body` for the graph without the plugin node, which declares no `gain` (an undeclared param is a 400)."""
    return {**body, "params": {k: v for k, v in body["params"].items() if k != "gain"}}


def _serve(tmp: Path, graph: Path) -> Server:
    plan = tmp / f"{graph.stem}.plan.bin"
    plan.write_bytes(compile_file(str(graph), Options(preset="tiny")).data)
    server = Server(str(plan))
    server.wait_ready()
    return server


def _audio(server: Server, key: str, body: dict = BODY) -> np.ndarray:
    status, out = http("POST", f"{server.url}/v1/tasks/speech", body)
    assert status == 200, out
    t = out["tensors"][key]
    assert t["dtype"] == "float32"
    return np.frombuffer(base64.b64decode(t["data"]), dtype=np.float32)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plugin")
    raw = yaml.safe_load(GRAPH.read_text())
    del raw["nodes"]["louder"], raw["params"]["gain"]
    raw["walks"]["vocode"] = ["snac"]
    without = tmp / "without_plugin.yaml"          # the same graph without the plugin node
    without.write_text(yaml.safe_dump(raw))
    with_plugin, plain = _serve(tmp, GRAPH), _serve(tmp, without)
    yield with_plugin, plain
    for s in (with_plugin, plain):
        s.proc.terminate()
        s.proc.wait(30)


def test_models_report_the_plugin_node(servers) -> None:
    with_plugin, _ = servers
    status, models = http("GET", f"{with_plugin.url}/v1/models")
    assert status == 200 and "louder" in str(models)


def test_plugin_executor_fades_in_across_chunks_per_request(servers) -> None:
    """The plugin's output is SNAC's (the same seeded weights without the plugin) times a ramp over
    the first 3,000 samples counted across chunks and the request's gain (the module's learned
    gain is its initial 1.0); float32 products in the same order on both sides, so only the last
    bit may differ (atol 1e-6 on samples in [-1, 1])."""
    with_plugin, plain = servers
    base = _audio(plain, "snac.audio", _without_gain(BODY))
    assert base.size > 3000 and np.abs(base).max() > 0      # several chunks: the ramp spans a boundary
    ramp = np.minimum(np.arange(base.size, dtype=np.float32) / np.float32(3000), np.float32(1))
    expected = np.clip((base * ramp) * np.float32(1.5), -1, 1)
    got = _audio(with_plugin, "louder.audio")
    # the docstring's last bit (fp32 ulp 6e-8 on samples in [-1, 1]); measured exact
    np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)
    # two requests at once on one server: each has its own ramp (state per request, not per executor)
    bodies = [{**BODY, "inputs": [{"type": "tokens", "ids": ids}]} for ids in ([8, 9], [10, 11, 12, 13])]
    got_together: dict[int, np.ndarray] = {}
    threads = [threading.Thread(target=lambda i=i: got_together.__setitem__(i, _audio(with_plugin, "louder.audio", bodies[i])))
               for i in range(2)]
    [t.start() for t in threads]
    [t.join(120) for t in threads]
    for i, body in enumerate(bodies):
        base = _audio(plain, "snac.audio", _without_gain(body))
        ramp = np.minimum(np.arange(base.size, dtype=np.float32) / np.float32(3000), np.float32(1))
        # as above: the same float32 products in the same order, the last bit at most; measured exact
        np.testing.assert_allclose(got_together[i], np.clip((base * ramp) * np.float32(1.5), -1, 1), atol=1e-6, rtol=0)
