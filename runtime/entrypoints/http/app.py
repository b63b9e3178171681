"""The aiohttp application: routes, auth, body limits, and the server's life cycle.

`MstarServer` owns the conductor (same process, same asyncio loop), the served model's
tokenizer and the metrics. `serve(config)` runs it until SIGTERM/SIGINT, then drains:
new requests get 503, running ones finish (up to `drain_timeout_s`), workers shut down.
"""
from __future__ import annotations

import asyncio
import hmac
import logging
import os
import signal
import time
from typing import Any, Callable

from aiohttp import web

from mstar_compiler.plan import load_plan
from mstar_compiler.plan_view import own_view
from runtime.ranks.ray.ray_launcher import RayLauncher
from runtime.conductor.conductor import Conductor
from runtime.conductor.config import ConductorConfig
from runtime.conductor.request import Request
from runtime.ranks.start_watch import StartFailed
from runtime.conductor.scheduler import SchedulerConfig
from runtime.entrypoints.http.audio_metrics import AudioMetrics, RealtimeMetrics, RuntimeCollector
from runtime.entrypoints.http.audio_routes import install_audio_routes
from runtime.entrypoints.http.completions import completions
from runtime.entrypoints.http.context import ServerConfig
from runtime.entrypoints.http.errors import ApiError, error_middleware
from runtime.entrypoints.http.families import families_of
from runtime.entrypoints.http.limits import strict_json
from runtime.entrypoints.http.metrics import Metrics
from runtime.entrypoints.http.model_serving import IncludedServing, ModelServing
from runtime.entrypoints.http.page import install_page
from runtime.entrypoints.http.prefix_metrics import PrefixCacheCollector
from runtime.entrypoints.http.realtime import converses
from runtime.entrypoints.http.schemas import Body, parse_body
from runtime.entrypoints.http.state_feed import install_state_feed
from runtime.entrypoints.http.tasks import run_task
from runtime.entrypoints.http.images import images_edits, images_generations
from runtime.entrypoints.http.transcriptions import audio_transcriptions, audio_translations
from runtime.transport.messages import NodeInfo
from runtime.worker.loader import check_plan_sources
from runtime.model_executor.weights.sources import resolve_all

log = logging.getLogger(__name__)


class MstarServer(ModelServing):
    """Everything one `mstar-run` process serves; its handlers see it as a `ServerContext` (context.py)."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.plan = plan = load_plan(config.plan_path)
        self.metrics = Metrics()
        # resolved before any worker starts: a node without weights fails here, in seconds
        self.weights = resolve_all(self.plan, config.weights)
        check_plan_sources(self.plan, self.weights)   # and one that would not load (headers only)
        self.random_nodes = sorted(name for name, w in self.weights.items() if w.kind == "random")
        if self.random_nodes:
            log.warning("RANDOM WEIGHTS (seeded, not a checkpoint) for nodes: %s", ", ".join(self.random_nodes))
        self.launcher = RayLauncher(config.ray, self.plan, config.plan_path) if config.ray else None
        self.conductor = Conductor(self.plan, ConductorConfig(
            plan_path=config.plan_path, worker_host=config.host, remote_ranks=config.remote_ranks,
            launcher=self.launcher,
            endpoint=self.launcher.conductor_endpoint(config.worker_endpoint) if self.launcher else config.worker_endpoint,
            keys_dir=config.keys_dir, max_queue=config.max_queue,
            weights=config.weights, log_level=config.log_level,
            scheduler=SchedulerConfig(max_running=config.max_concurrency, batch_invariant=config.batch_invariant,
                                      prefill_chunk_tokens=config.prefill_chunk_tokens,
                                      prefill_chunk_alone_tokens=config.prefill_chunk_alone_tokens,
                                      max_batch_tokens=config.max_batch_tokens),
            prefix_cache=config.prefix_cache),
            on_batch=self.metrics.observe_batch)
        self.metrics.registry.register(PrefixCacheCollector(self.conductor.ledger))
        self.metrics.registry.register(RuntimeCollector(self.conductor))
        self.audio_metrics = AudioMetrics(self.metrics.registry)
        self.draining = False
        # the plan's own model; a plan with includes is that and each included model under its own name
        self.serve_model(own_view(self.plan) if self.plan.models else self.plan, self.weights)
        self.plan = plan
        self.included = [IncludedServing(self, m.name, self.weights) for m in plan.models]
        listens = any(converses(m) for m in self.models_served())
        self.realtime_metrics = RealtimeMetrics(self.metrics.registry) if listens else None

    # ---- helpers the handlers use --------------------------------------------------

    def models_served(self) -> list[ModelServing]:
        """This server's models: the plan's own, then each included one."""
        return [self, *self.included]

    def serving(self, model: Any, able: Callable[[ModelServing], bool] | None = None) -> ModelServing:
        """The served model a request names (400 if `model` is no string, 404 if none has that name);
        with `able` and no name, the first model that is able (the plan's own first)."""
        if model is None and able is not None:
            return next((m for m in self.models_served() if able(m)), self)
        if not isinstance(model, str):
            raise ApiError(400, "'model' must be a string", "model")
        found = next((m for m in self.models_served() if m.model_id == model), None)
        if found is None:
            names = ", ".join(f"'{m.model_id}'" for m in self.models_served())
            raise ApiError(404, f"the model '{model}' does not exist; this server serves {names}",
                           "model", "model_not_found")
        return found

    async def read_json(self, request: web.Request) -> Any:
        return strict_json(await self._read(request))

    async def read_body(self, request: web.Request, schema: type[Body]) -> Body:
        return parse_body(await self._read(request), schema)

    async def _read(self, request: web.Request) -> bytes:
        if self.draining:
            raise ApiError(503, "the server is shutting down", code="shutting_down")
        return await request.read()

    def observe_finished(self, req: Request) -> None:
        now = time.monotonic()
        if req.first_token_at is not None:
            self.metrics.ttft.observe(req.first_token_at - req.arrival)
        self.metrics.e2e.observe(now - req.arrival)
        self.metrics.requests.labels(req.finish_reason or "unknown").inc()
        self.metrics.generated.inc(len(req.output_ids))
        for node, (rank, _) in req.produced.items():
            self.metrics.rank_requests.labels(str(rank), node).inc()

    # ---- simple routes ---------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        """ok / degraded for anyone; ranks, worker pids and whether the Ray cluster checks tokens only
        for a caller with the API key (every caller when the server has none)."""
        ready = self.conductor.workers.ready_ranks()
        ok = len(ready) == len(self.plan.ranks) and not self.draining
        body: dict[str, Any] = {"status": "ok" if ok else "degraded", "random_weights": self.random_nodes}
        if self.is_authorised(request):
            body.update(ready_ranks=sorted(ready),
                        worker_pids={str(r): s.pid for r, s in self.conductor.workers.ranks.items()})
            if self.launcher is not None:   # a cluster anyone may run code in is said, not kept quiet
                body["ray_token_auth"] = self.launcher.has_token_auth
        return web.json_response(body, status=200 if ok else 503)

    def is_authorised(self, request: web.Request) -> bool:
        """The request carries the API key (constant-time comparison), or the server has none."""
        if self.config.api_key is None:
            return True
        given = request.headers.get("Authorization", "")
        if not given and request.path == "/v1/state/stream":    # EventSource cannot send headers: the page's
            given = f"Bearer {request.query.get('api_key', '')}"  # live feed may carry the key as ?api_key=
        return hmac.compare_digest(given.encode(), f"Bearer {self.config.api_key}".encode())

    async def models(self, request: web.Request) -> web.Response:
        """The plan's own model and each one it includes, each with its tasks and its nodes' weights."""
        return web.json_response({"object": "list", "data": [self._card(m) for m in self.models_served()]})

    def _card(self, model: ModelServing) -> dict[str, Any]:
        plan, mine = model.plan, {n.name for n in model.plan.nodes}
        card = {"id": model.model_id, "object": "model", "created": 0, "owned_by": "mstar",
                "tasks": [t.name for t in plan.tasks], "preset": plan.preset, "placement": plan.placement,
                "weights": {name: source.describe() for name, source in self.weights.items() if name in mine},
                "random_weights": [n for n in self.random_nodes if n in mine],
                "batch_invariant": self.config.batch_invariant, "prefix_cache": self.config.prefix_cache,
                "dtype": {n.name: n.dtype for n in plan.nodes}, "tool_prompt": model.tool_prompt,
                "quant": {n.name: n.quant for n in plan.nodes if n.quant},
                "ranks": {str(r): {n.name: {"params": n.num_params, **_compiled(n)} for n in s.nodes
                                   if n.name in mine} for r, s in sorted(self.conductor.workers.ranks.items())}}
        if isinstance(model, IncludedServing):     # its nodes are `<include>.<name>` in the plan
            card["included_as"] = model.include
        if self.launcher is not None:    # where the cluster manager put each rank
            card["cluster"] = self.conductor.workers.placement()
        return card

    async def metrics_route(self, request: web.Request) -> web.Response:
        stats = {**self.conductor.stats(), "restarts": sum(s.restarts for s in self.conductor.workers.ranks.values()),
                 "refused_peers": self.conductor.guard.admission.refused
                 + sum(b.refused_peers for b in self.conductor.worker_stats.values()),
                 "threads": {str(r): (b.threads, b.threads_allotted) for r, b in self.conductor.worker_stats.items()
                             if b.threads_allotted}}
        return web.Response(body=self.metrics.render(stats), content_type="text/plain")

    # ---- application -----------------------------------------------------------------

    def app(self) -> web.Application:
        middlewares = [error_middleware] + ([self._auth] if self.config.api_key else [])
        app = web.Application(middlewares=middlewares, client_max_size=self.config.max_body_bytes)
        app["mstar"] = self
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics_route)
        app.router.add_get("/v1/models", self.models)
        install_audio_routes(self, app)    # /v1/chat/completions (text or audio), /v1/audio/speech
        app.router.add_post("/v1/audio/transcriptions", audio_transcriptions)
        app.router.add_post("/v1/audio/translations", audio_translations)
        app.router.add_post("/v1/images/generations", images_generations)
        app.router.add_post("/v1/images/edits", images_edits)
        app.router.add_post("/v1/completions", completions)
        for family in families_of(self.plan):   # a family's own endpoints: V-JEPA's rollouts
            if family.install is not None:
                family.install(app)
        app.router.add_post("/v1/tasks/{task}", run_task)
        install_state_feed(self, app)   # /v1/state, /v1/state/stream (SSE)
        install_page(app)               # /, /static/*, /v1/graph
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler) -> web.StreamResponse:
        guarded = request.path.startswith("/v1/") or request.path == "/metrics" and not self.config.metrics_public
        if guarded and not self.is_authorised(request):
            how = " or ?api_key=<key>" if request.path == "/v1/state/stream" else ""
            raise ApiError(401, f"invalid or missing API key (Authorization: Bearer <key>{how})", code="invalid_api_key")
        return await handler(request)

    async def drain(self) -> None:
        """Refuse new requests, let running ones finish, stop the workers."""
        self.draining = True
        deadline = time.monotonic() + self.config.drain_timeout_s
        while self.conductor.requests and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await self.conductor.stop()


async def _serve(config: ServerConfig) -> None:
    server = MstarServer(config)
    try:
        await server.conductor.start(config.ready_timeout_s)     # stops its workers itself when it fails
    except StartFailed as exc:
        raise SystemExit(f"mstar-run: {exc}") from None
    runner = web.AppRunner(server.app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    try:
        await site.start()
    except OSError as exc:   # the port is taken: said, and the workers go with the server
        await server.conductor.stop()
        await runner.cleanup()
        raise SystemExit(f"mstar-run: cannot listen on {config.host}:{config.port}: {exc.strerror}") from None
    port = runner.addresses[0][1]       # the bound one: --port 0 lets the system pick
    if config.port_file:
        _write_port_file(config.port_file, port)
    log.info("serving %s on http://%s:%d (workers connect to %s)", server.model_id, config.host, port,
             server.conductor.endpoint)
    print(f"mstar-run: serving {server.model_id} on http://{config.host}:{port} "
          f"(workers: {server.conductor.endpoint})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("draining")
    await server.drain()
    await runner.cleanup()


def _write_port_file(path: str, port: int) -> None:
    """`port` into `path`, whole or not at all: a reader polling for the file never sees half of it."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{port}\n")
    os.replace(tmp, path)


def serve(config: ServerConfig) -> None:
    """Run the server until SIGTERM/SIGINT (`mstar-run plan.bin`)."""
    asyncio.run(_serve(config))


def _compiled(node: NodeInfo) -> dict[str, object]:
    """/v1/models' notes of a node's CPU kernels: its inductor-compiled decode steps (nothing when eager)
    and whether a decoder LM's layers run the fused CPU kernels."""
    return {**({"cpu_compiled_buckets": node.compiled_buckets} if node.compiled_buckets else {}),
            **({"cpu_kernels": node.cpu_kernels} if node.cpu_kernels else {})}
