"""What the server's handlers share: its settings and the interface of the running server.

`MstarServer` (app.py, the composition root) builds every piece and installs the handlers;
a handler (and a family's serving code, runtime/models/<family>/) reaches the server as
`request.app["mstar"]` and may use only what `ServerContext` declares. So handlers import
this module, never app.py, and the imports of the HTTP layer point one way.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol

from runtime.entrypoints.http.families import ServedModel
from runtime.model_executor.weights.sources import WeightOptions

if TYPE_CHECKING:
    from aiohttp import web

    from runtime.ranks.ray.ray_launcher import RayOptions
    from runtime.conductor.conductor import Conductor
    from runtime.conductor.request import Request
    from runtime.entrypoints.http.audio_metrics import AudioMetrics, RealtimeMetrics
    from runtime.entrypoints.http.chat_inputs import ChatInputs
    from runtime.entrypoints.http.families import Drawer, Listener, Transcriber
    from runtime.entrypoints.http.limits import ServeLimits
    from runtime.entrypoints.http.speech_detector import SpeechDetector
    from runtime.entrypoints.http.schemas import Body
    from runtime.entrypoints.http.speech_model import SpeechModel


@dataclass(frozen=True)
class ServerConfig:
    plan_path: str
    host: str = "127.0.0.1"
    port: int = 8000                     # 0: the system picks a free one (see port_file)
    port_file: str | None = None         # written with the bound port once HTTP serves (--port-file)
    api_key: str | None = None           # guards /v1/* and /metrics; /health shows internals only with it
    metrics_public: bool = False         # /metrics without the key (a scraper on a trusted network)
    max_concurrency: int = 256           # requests admitted at once; more wait in the queue
    max_queue: int = 1024                # requests waiting at once; more get 429 with Retry-After
    max_body_bytes: int = 16 << 20
    weights: WeightOptions = WeightOptions()   # --weights values and --random-weights
    log_level: str = "info"
    worker_endpoint: str = "tcp://127.0.0.1:0"   # where workers connect
    remote_ranks: frozenset[int] = frozenset()
    keys_dir: str | None = None          # CURVE keys from `mstar-run keygen`; None: fresh ones per start
    request_timeout_s: float = 600.0
    batch_invariant: bool = False        # every forward holds one request's Run (see `mstar-run --help`)
    prefix_cache: bool = True            # reuse the KV blocks of equal prompt prefixes across requests
    prefill_chunk_tokens: int = 256      # prompt tokens per prefill chunk (0: whole prompts)
    prefill_chunk_alone_tokens: int = 1024   # the chunk of a request alone in the server (0: the above)
    max_batch_tokens: int = 4096         # rows per batch of a node (SchedulerConfig.max_batch_tokens)
    drain_timeout_s: float = 30.0
    ready_timeout_s: float = 300.0       # a worker not ready and without a start step this long fails the start
    ray: RayOptions | None = None        # --ray: the ranks run as actors on a Ray cluster


class ServerContext(ServedModel, Protocol):
    """The running server as its handlers see it (`MstarServer` in app.py is the implementation).
    Every attribute is set when the server is built and owned by it; handlers read them."""

    config: ServerConfig
    conductor: Conductor
    include: str                             # the include this model is served from ("": the plan's own)
    chat_node: str | None                    # the LM node that reads a chat prompt's tokens; None: no chat task
    chat_inputs: ChatInputs | None           # the family's reader of audio/image chat parts, if any
    transcriber: Transcriber | None          # a speech recognition family's answer to the transcription routes
    drawer: Drawer | None                    # an image generating family's answer to the image routes
    speech_model: SpeechModel | None         # how the plan speaks; None: it does not
    audio_metrics: AudioMetrics              # what clients of speaking requests receive (/metrics)
    realtime_listener: Listener | None       # how the family hears a /v1/realtime session; None: it cannot
    realtime_metrics: RealtimeMetrics | None  # /v1/realtime's metrics, where it is served
    speech_detector: SpeechDetector | None   # the plan's voice activity detector (server VAD); None: none
    limits: ServeLimits                      # bounds on tools, schemas, conversations (the graph's params)
    draining: bool                           # shutting down: new requests get 503
    tool_prompt: str                         # how a chat's tools reach the prompt: "template" or "hermes" (tools.py)

    def check_model(self, model: Any) -> None:
        """ApiError 400 when `model` is no string, 404 when it names another model than this one."""

    def serving(self, model: Any, able: Callable[[ServerContext], bool] | None = None) -> ServerContext:
        """The served model a request names: this server's plan, or one it includes (model_serving.py);
        400 when `model` is no string, 404 (naming the served models) when none has that name; with
        `able` and no name, the first model for which `able` holds."""

    def models_served(self) -> list[ServerContext]:
        """Every model this server serves, the plan's own first."""

    async def read_json(self, request: web.Request) -> Any:
        """The request's JSON body (strict: no NaN or Infinity); 503 while draining, 400 if not JSON."""

    async def read_body(self, request: web.Request, schema: type[Body]) -> Body:
        """The request's JSON body parsed into `schema` (schemas.py); 503 while draining, 400 naming
        the field that does not fit."""

    def constrains_output(self) -> bool:
        """Whether the chat LM samples under a request's grammar (response_format, forced tool calls)."""

    def observe_finished(self, req: Request) -> None:
        """Record a request that completed on /metrics (latencies, tokens, where it ran)."""
