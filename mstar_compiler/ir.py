"""The compiler's intermediate representation: one `IR` object that the passes fill in.

Each pass (`mstar_compiler/passes/<name>.py`) takes the IR, checks and adds its part,
and returns it; `mstar_compiler.verify` states what must hold after each pass. Parts that
reach the runtime reuse the plan's structs (`mstar_compiler.plan`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

from mstar_compiler import plan
from mstar_compiler.catalogue import Catalogue, KindSpec
from mstar_compiler.errors import Path
from mstar_compiler.passes.load import Doc


@dataclass(frozen=True)
class Options:
    """Command-line choices."""

    preset: str | None = None            # graph-level preset (default: "tiny", else the first)
    placement: str | None = None         # placement profile (default: `default_placement`, else the first)
    device_memory: int | None = None     # bytes per device (default: the preset's, else 80 GiB)
    devices: int | None = None           # number of ranks (default: highest placed rank + 1)
    quant: dict[str, str] = field(default_factory=dict)   # node -> scheme, over the graph's `quant:` (--quant)


@dataclass
class ParamIR:
    spec: plan.Param
    path: Path


@dataclass
class NodeIR:
    name: str
    kind: str
    spec: KindSpec
    preset: str
    dims: dict[str, Any]
    args: dict[str, Any]
    param_args: dict[str, str]
    weight_key: str
    dtype: str
    has_kv_cache: bool
    block_tokens: int                                          # YAML kv_cache.page_tokens
    max_blocks: int | None                                     # YAML kv_cache.max_pages
    max_batch: int
    path: Path
    weights: str | None = None                                 # resolve: preset `weights:` source
    weight_map: plan.WeightMap | None = None                   # resolve: preset `weights:` mapping
    random_weights: bool = False                               # resolve: preset `random_weights:`
    executor: str = ""                                         # resolve: the runtime executor's name (Family.executors)
    declared_layers: int = 0                                   # resolve: preset `layers:`, where fewer than ...
    published_layers: int = 0                                  # ... the kind preset's layers
    quant: str = ""                                            # resolve: `quant:` scheme ("" = none) ...
    quant_path: Path = ()                                      # ... and where the graph says it
    inputs: list[plan.Port] = field(default_factory=list)     # typecheck
    outputs: list[plan.Port] = field(default_factory=list)    # typecheck
    placement: plan.Placement | None = None                   # place
    kv_pools: list[plan.KVPool] = field(default_factory=list)  # memory


@dataclass
class NodeStep:
    node: str
    path: Path


@dataclass
class ParStep:
    branches: list[list[NodeStep]]
    path: Path


@dataclass
class CarryIR:
    carry: plan.Carry
    path: Path


@dataclass
class EmitIR:
    output: plan.LoopOutput
    path: Path


@dataclass
class LoopStep:
    dynamic: bool                         # DynamicLoop (until + max) or Loop (repeat)
    count: plan.Count                     # repeat count, or max for a DynamicLoop
    until: list[plan.ExitCond]
    body: SeqStep
    carries: list[CarryIR]
    emits: list[EmitIR]
    watch: tuple[str, str] | None         # node, port the eos/stop_token conditions test
    path: Path


@dataclass
class SeqStep:
    steps: list[Step]
    path: Path


Step = Union[NodeStep, ParStep, LoopStep, SeqStep]


@dataclass
class EdgeDecl:
    src_node: str
    src_port: str
    dst_node: str
    dst_port: str
    path: Path


@dataclass
class StreamIR:
    name: str
    src_node: str
    src_port: str
    dst_node: str
    dst_port: str
    policy: plan.ChunkPolicy
    path: Path
    policy_path: Path = ()      # where the policy kind was written (in the stream, or a graph preset override)


@dataclass
class TaskStreamIR:
    spec: plan.TaskStream
    path: Path
    policy_path: Path


@dataclass
class WalkRunIR:
    walk: str
    path: Path


@dataclass
class ForEachIR:
    walks: dict[str, list[str]]           # input modality -> walks run per item
    path: Path


@dataclass
class IfIR:
    cond: plan.Cond
    then: list[TaskStepIR]
    otherwise: list[TaskStepIR]
    path: Path


TaskStepIR = Union[WalkRunIR, ForEachIR, IfIR]


@dataclass
class TrackIR:
    name: str
    steps: list[TaskStepIR]
    per_chunk: str | None
    path: Path


@dataclass
class TaskIR:
    name: str
    tracks: list[TrackIR]
    path: Path


def task_walks(steps: list[TaskStepIR], modality: str | None = None) -> list[str]:
    """The walks a track's steps may run: every branch's, and a `for_each`'s for `modality` (None: all)."""
    out: list[str] = []
    for step in steps:
        if isinstance(step, WalkRunIR):
            out.append(step.walk)
        elif isinstance(step, ForEachIR):
            out += [w for m, walks in step.walks.items() if modality in (None, m) for w in walks]
        elif isinstance(step, IfIR):
            out += task_walks(step.then, modality) + task_walks(step.otherwise, modality)
    return out


@dataclass
class CascadeIR:
    spec: plan.Cascade
    path: Path
    stage_paths: list[Path]               # each stage's entry, in order


@dataclass
class IncludeIR:
    """One included graph, resolved (pass resolve, `include.py`); its names prefixed by `<include>.`."""

    model: plan.IncludedModel             # the plan's record of it
    profile: dict[str, Any]               # its placement profile: node (or `<include>.*`) -> rank spec
    profile_path: Path                    # where that profile is written (in the included file)
    device_memory: int                    # its graph preset's device memory (or the default)
    path: Path                            # its `include:` entry


@dataclass
class IR:
    """Everything the passes know; filled in pipeline order."""

    doc: Doc
    catalogue: Catalogue
    options: Options
    include_chain: tuple[str, ...] = ()   # real paths of the files including this one, outermost first
    # resolve
    includes: dict[str, IncludeIR] = field(default_factory=dict)   # by prefix (nested: `a.b`)
    included_texts: list[str] = field(default_factory=list)        # their files' text, in include order
    model: str = ""
    preset: str = ""
    device_memory: int = 0
    params: dict[str, ParamIR] = field(default_factory=dict)
    nodes: dict[str, NodeIR] = field(default_factory=dict)
    walks: dict[str, SeqStep] = field(default_factory=dict)
    edge_decls: list[EdgeDecl] = field(default_factory=list)
    streams: dict[str, StreamIR] = field(default_factory=dict)
    task_streams: dict[str, TaskStreamIR] = field(default_factory=dict)   # client text into a task, per clause
    tasks: dict[str, TaskIR] = field(default_factory=dict)
    cascades: dict[str, CascadeIR] = field(default_factory=dict)      # tasks of tasks, run by the server
    default_task: str = ""
    placement_name: str = ""
    # typecheck
    edges: list[plan.Edge] = field(default_factory=list)
    request_inputs: list[plan.RequestInput] = field(default_factory=list)
    walk_outputs: dict[str, list[plan.LoopOutput]] = field(default_factory=dict)
    # lower
    programs: dict[str, list[plan.Op]] = field(default_factory=dict)
    task_tables: list[plan.Task] = field(default_factory=list)
    # place
    num_ranks: int = 0
    transfers: list[plan.Transfer] = field(default_factory=list)
    # memory
    ranks: list[plan.Rank] = field(default_factory=list)
    # capture
    capture_regions: list[plan.CaptureRegion] = field(default_factory=list)
    # buffers
    plan_streams: list[plan.Stream] = field(default_factory=list)
