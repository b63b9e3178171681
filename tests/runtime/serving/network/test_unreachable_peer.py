"""A rank whose address its peers cannot reach is said at once, naming the rank, the address and
how long was waited: when it joins (the server log), and for the request that needed it (a 5xx
after the 5 s push timeout, not a silent 30 s wait per batch); a worker with no route to its
conductor says so and exits."""
from __future__ import annotations

import sys
import time

import openai
import pytest

from runtime.transport.queues import PUSH_TIMEOUT_S
from tests.runtime.serving.conftest import compile_plan
from tests.runtime.serving.network.conftest import Cluster, keygen
from tests.runtime.serving.speech.conftest import ORPHEUS

NOBODY = "10.201.0.99"   # in the namespaces' /24, on no host


def test_a_rank_advertising_an_unreachable_address_is_named(net, tmp_path) -> None:
    plan = compile_plan(tmp_path, "orpheus", "tiny", "disaggregated")
    log = tmp_path / "server.log"
    cluster = Cluster(net, plan, keygen(tmp_path, 2), {1: 1}, log=log,
                      worker_args={1: ["--host", "0.0.0.0", "--advertise", NOBODY]})
    try:
        cluster.wait_ready()

        def speak() -> None:
            client = cluster.client()
            client.audio.speech.create(model=ORPHEUS, voice="tara", input="Hi.", response_format="pcm",
                                       extra_body={"max_tokens": 14})

        start = time.monotonic()
        with pytest.raises(openai.APIStatusError) as caught:
            cluster.call(speak)
        waited = time.monotonic() - start
        # rank 0's push of the prefill's output (or of the KV cache) to rank 1 fails
        message = caught.value.message
        assert caught.value.status_code in (500, 502) and "rank 0" in message, message
        assert f"rank 1 at tcp://{NOBODY}:" in message and f"within {PUSH_TIMEOUT_S:.0f} s" in message, message
        assert waited < 25, f"answered after {waited:.0f} s: the push timeout, not the 30 s input wait"
    finally:
        cluster.stop()
    text = log.read_text()
    assert f"rank 0 cannot reach rank 1 at tcp://{NOBODY}:" in text and " after " in text, text[-2000:]


def test_a_worker_with_no_route_to_its_conductor_says_so(net, tmp_path) -> None:
    plan = compile_plan(tmp_path, "orpheus", "tiny", "disaggregated")
    done = net.run(1, [sys.executable, "-m", "runtime.cli", "worker", "--conductor", "tcp://192.0.2.1:5555",
                       "--rank", "1", plan], timeout=120)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "no route from this host to the conductor at 192.0.2.1" in done.stderr
    assert "Traceback" not in done.stderr
