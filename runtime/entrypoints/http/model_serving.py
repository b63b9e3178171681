"""One model the server serves: its plan as its clients see it, its tokenizer, chat LM, speech and limits.

A plan compiled from one graph is one model: `MstarServer` (app.py) is its `ModelServing`. A plan
that includes several graphs (`include:`, mstar_compiler/plan_view.py) is served as the plan itself
(its own tasks, e.g. a cascade across the models, under the plan's `model:`) and as each included
model under that model's own name: an `IncludedServing` per include, whose plan is the include's
view and whose conductor (`ScopedConductor`) names its tasks and params as the plan does. The
conductor, the workers, the metrics and the settings are the server's, shared by all of them.
`ServerContext.serving(model)` picks the one a request names.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

from mstar_compiler.plan import Plan
from mstar_compiler.plan_view import model_view
from runtime.entrypoints.http.chat_inputs import chat_inputs_for
from runtime.entrypoints.http.errors import ApiError
from runtime.entrypoints.http.families import drawer_for, transcriber_for
from runtime.entrypoints.http.limits import serve_limits
from runtime.entrypoints.http.realtime import realtime_listener
from runtime.entrypoints.http.speech_detector import speech_detector
from runtime.entrypoints.http.speech_model import speech_model
from runtime.entrypoints.http.tools import renders_tools
from runtime.model_executor.sampling import SamplingParams, stop_token_ids
from runtime.text import load_text_tokenizer

if TYPE_CHECKING:
    from aiohttp import web

    from runtime.conductor.conductor import Conductor
    from runtime.conductor.request import Request
    from runtime.entrypoints.http.context import ServerConfig, ServerContext
    from runtime.entrypoints.http.schemas import Body
    from runtime.model_executor.weights.sources import NodeWeights
    from runtime.transport.request_params import RequestParams


def chat_node(plan: Plan) -> str | None:
    """The LM node that reads the chat prompt's tokens, if the plan has a chat task."""
    names = {t.name for t in plan.tasks}
    task = "chat" if "chat" in names else plan.default_task
    walks = {s.walk for t in plan.tasks if t.name == task for tr in t.tracks for s in tr.states if s.walk}
    return next((ri.node for ri in plan.request_inputs if ri.walk in walks and ri.dtype == "tokens"), None)


class ModelServing:
    """The parts of one served model (`ServerContext` declares what handlers read of them)."""

    plan: Plan
    conductor: Any                        # the server's Conductor, or a ScopedConductor onto it
    include: str = ""                     # the include it is served from ("": the plan's own model)

    def serve_model(self, plan: Plan, weights: dict[str, NodeWeights]) -> None:
        """Build the model's parts from its `plan` and the server's resolved `weights`."""
        self.plan = plan
        self.model_id = plan.model
        self.chat_node = chat_node(plan)
        self.tokenizer = load_text_tokenizer(weights[self.chat_node].path if self.chat_node else None)
        template = getattr(self.tokenizer, "chat_template", None)
        # how a chat's tools reach the prompt: the template renders them, or tools.py's Hermes system message
        self.tool_prompt = "template" if renders_tools(template.source if template else None) else "hermes"
        self.chat_inputs = chat_inputs_for(plan)   # the family's reader of audio/image parts, if any
        self.transcriber = transcriber_for(plan)   # a speech recognition family's own transcriptions
        self.drawer = drawer_for(plan)             # an image generating family's answer to the image routes
        self.speech_model = speech_model(plan)
        self.realtime_listener = realtime_listener(plan) if self.speech_model else None
        self.speech_detector = speech_detector(plan) if self.realtime_listener else None
        self.limits = serve_limits(plan)

    def check_model(self, model: Any) -> None:
        """400 when `model` is no string, 404 when it names no model of the server, or another than this one
        (a handler that did not route its request by `serving`)."""
        if self.serving(model) is not self:
            raise ApiError(404, f"the model '{model}' is not served on this route", "model", "model_not_found")

    def serving(self, model: Any, able: Callable[[ServerContext], bool] | None = None) -> ServerContext:
        raise NotImplementedError

    def constrains_output(self) -> bool:
        """Whether the chat LM samples under a request's grammar on every rank that holds it."""
        infos = [n for s in self.conductor.workers.ranks.values() for n in s.nodes if n.name == self.chat_node]
        return bool(infos) and all(n.grammars for n in infos)

    def stop_token_ids(self, extra: Sequence[int] = (), ignore_eos: bool = False) -> frozenset[int]:
        """The ids a request stops at, for every handler: the tokenizer's end-of-sequence ids, the end
        token the chat LM's dims name (BAGEL's), and the request's own `stop_token_ids`; with
        `ignore_eos` (forced lengths) none."""
        if ignore_eos:
            return frozenset()
        lm_eos = self.plan.node(self.chat_node).dims.get("eos_token_id") if self.chat_node else None
        eos = (*self.tokenizer.eos_token_ids, *(() if lm_eos is None else (int(lm_eos),)))
        return stop_token_ids(SamplingParams(stop_token_ids=tuple(extra)), eos)


class ScopedConductor:
    """The server's conductor as an included model's handlers use it: they name the model's tasks and
    params as its own graph does; the plan names them `<include>.<name>`."""

    def __init__(self, conductor: Conductor, scope: str) -> None:
        self._conductor = conductor
        self.scope = scope

    @property
    def config(self) -> Any:
        return self._conductor.config

    @property
    def streams(self) -> Any:
        return self._conductor.streams

    @property
    def workers(self) -> Any:              # made when the conductor starts
        return self._conductor.workers

    def submit(self, task: str, params: RequestParams, input_items: list[tuple[str, Any]],
               stop_token_ids: frozenset[int] = frozenset(), timeout_s: float | None = None,
               port_inputs: dict[str, Any] | None = None) -> Request:
        return self._conductor.submit(f"{self.scope}.{task}", params.under(self.scope), input_items,
                                      stop_token_ids, timeout_s, port_inputs)

    def abort(self, req: Request, reason: str = "abort") -> None:
        self._conductor.abort(req, reason)

    def end_early(self, req: Request, reason: str) -> None:
        self._conductor.end_early(req, reason)

    async def push_stream(self, req: Request, stream: str, items: list[dict[str, Any]]) -> None:
        await self._conductor.push_stream(req, stream, items)

    def close_stream(self, req: Request, stream: str) -> None:
        self._conductor.close_stream(req, stream)


class IncludedServing(ModelServing):
    """An included model of the server's plan, served under its own name; the rest is the server's."""

    def __init__(self, server: ServerContext, name: str, weights: dict[str, NodeWeights]) -> None:
        self.server = server
        self.include = name
        self.conductor = ScopedConductor(server.conductor, name)
        self.serve_model(model_view(server.plan, name), weights)

    @property
    def config(self) -> ServerConfig:
        return self.server.config

    @property
    def draining(self) -> bool:
        return self.server.draining

    @property
    def audio_metrics(self) -> Any:
        return self.server.audio_metrics

    @property
    def realtime_metrics(self) -> Any:
        return self.server.realtime_metrics

    def serving(self, model: Any, able: Callable[[ServerContext], bool] | None = None) -> ServerContext:
        return self.server.serving(model, able)

    def models_served(self) -> list[ServerContext]:
        return self.server.models_served()

    async def read_json(self, request: web.Request) -> Any:
        return await self.server.read_json(request)

    async def read_body(self, request: web.Request, schema: type[Body]) -> Body:
        return await self.server.read_body(request, schema)

    def observe_finished(self, req: Request) -> None:
        self.server.observe_finished(req)
