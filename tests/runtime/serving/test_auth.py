"""`--api-key` on a real `mstar-run`: /v1/* and /metrics need the key (unless --metrics-public),
/health answers ok/degraded to anyone and its internals (ranks, worker pids) only with the key."""
from __future__ import annotations

import pytest

from tests.runtime.serving.conftest import Server, compile_plan, http

KEY = {"Authorization": "Bearer s3cret"}
WRONG = {"Authorization": "Bearer s3cres"}


@pytest.fixture(scope="module", params=[False, True], ids=["metrics-guarded", "metrics-public"])
def server(request, plan_dir):
    extra = ["--metrics-public"] if request.param else []
    srv = Server(compile_plan(plan_dir, "smollm2", preset="tiny"), "--api-key", "s3cret", *extra,
                 env={"OMP_NUM_THREADS": "1"})
    srv.metrics_public = request.param
    try:
        srv.wait_ready(60)
        yield srv
    finally:
        srv.stop()


def test_v1_needs_the_key(server) -> None:
    assert http("GET", f"{server.url}/v1/models")[0] == 401
    status, body = http("GET", f"{server.url}/v1/models", headers=WRONG)
    assert status == 401 and body["error"]["type"] == "authentication_error"
    assert http("GET", f"{server.url}/v1/models", headers=KEY)[0] == 200


def test_metrics_need_the_key_unless_public(server) -> None:
    assert http("GET", f"{server.url}/metrics")[0] == (200 if server.metrics_public else 401)
    status, text = http("GET", f"{server.url}/metrics", headers=KEY)
    assert status == 200 and "mstar_refused_peers" in text


def test_health_shows_internals_only_with_the_key(server) -> None:
    # the tiny preset's random weights are said to anyone (loud, not an internal); ranks and pids are not
    public = {"status": "ok", "random_weights": ["lm"]}
    assert http("GET", f"{server.url}/health") == (200, public)
    assert http("GET", f"{server.url}/health", headers=WRONG) == (200, public)
    status, body = http("GET", f"{server.url}/health", headers=KEY)
    assert status == 200 and body["ready_ranks"] == [0] and body["worker_pids"]["0"] > 0
