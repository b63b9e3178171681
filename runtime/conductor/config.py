"""What a conductor is started with (`ConductorConfig`), and the refusal its admission queue gives (`QueueFull`)."""
from __future__ import annotations

from dataclasses import dataclass, field

from runtime.conductor.scheduler import SchedulerConfig
from runtime.model_executor.weights.sources import WeightOptions
from runtime.ranks.workers import RankLauncher


@dataclass(frozen=True)
class ConductorConfig:
    plan_path: str
    endpoint: str = "tcp://127.0.0.1:0"       # where workers connect (port 0: pick a free one)
    worker_host: str = "127.0.0.1"            # where local workers bind their inboxes (the server's --host)
    remote_ranks: frozenset[int] = frozenset()  # ranks whose workers are started by hand elsewhere
    keys_dir: str | None = None               # `mstar-run keygen` output (needed for remote ranks); None: per start
    weights: WeightOptions = WeightOptions()   # passed on to the local workers
    log_level: str = "info"
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    prefix_cache: bool = True                 # reuse cached KV blocks of equal prompt prefixes across requests
    max_queue: int = 1024                     # requests waiting for admission; more are refused (QueueFull)
    launcher: RankLauncher | None = None      # starts the local ranks elsewhere (runtime/ranks/ray); None: subprocesses


class QueueFull(RuntimeError):
    """The admission queue is full: the server answers 429 with Retry-After."""
