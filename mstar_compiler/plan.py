"""The plan: the one contract between the compiler (`mstarc`) and the runtime (`mstar-run`).

A plan is everything the runtime needs to serve one walk graph and nothing it has to
infer. It is built by the `emit` pass and read by the runtime with one call:

    from mstar_compiler.plan import load_plan
    plan = load_plan("bagel.plan.bin")

File layout of `plan.bin` (all integers little-endian):

    offset  size  field
    0       8     MAGIC = b"MSTARPLN"
    8       4     format version (uint32) = FORMAT_VERSION
    12      32    SHA-256 of the payload
    44      ...   payload: msgpack of `Plan` (msgspec, never pickle)

Identical input gives byte-identical files: every list below is in a fixed order
(declaration order of the graph file, or sorted where the graph has no order) and the
plan records no time, host or absolute path.

How the conductor reads each part of a plan: docs/architecture.md ("Reading a plan").
"""
from __future__ import annotations

import hashlib
import struct
from pathlib import Path
from typing import Any, Union

import msgspec

MAGIC = b"MSTARPLN"
FORMAT_VERSION = 1
DONE = -1                      # transition target: the track is finished
_HEADER = struct.Struct("<8sI32s")


class PlanFormatError(Exception):
    """A plan file that is not a plan, is corrupt, or has another format version."""


class Base(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=False):
    """Common options of every plan struct."""


# ---------------------------------------------------------------- ranks, params, ports


class Rank(Base):
    index: int                          # rank number, 0..len(ranks)-1 = worker id
    memory_bytes: int                   # device memory budget used for planning
    weight_bytes: int                   # bytes of weights resident on this rank (sum over weight groups)
    kv_bytes: int                       # bytes of KV pools on this rank (sum over KVPool.num_blocks * block_bytes)
    nodes: list[str]                    # nodes this rank loads (any walk), graph order
    activation_bytes: int = 0           # kept free for activations and capture buffers (a share of the budget)


class Param(Base):
    name: str                           # request field name, e.g. "steps"
    type: str                           # "integer" | "number" | "boolean" | "string"
    default: Any                        # value when the request omits it (None: required)
    minimum: float | int | None = None  # inclusive lower bound (integer/number)
    maximum: float | int | None = None  # inclusive upper bound (integer/number)
    choices: list[Any] | None = None    # allowed values (enum), None = any
    doc: str = ""                       # one line for people (API docs, explain)


class Port(Base):
    name: str                           # port name, `node.port` in YAML
    dtype: str                          # one of catalogue.PORT_DTYPES
    shape: list[str | int]              # axes: int = resolved from preset dims, str = dynamic symbol ("T")
    stream: bool = False                # input: end of a streaming edge / output: emits item by item
    optional: bool = False              # input may be left unconnected


# ---------------------------------------------------------------- nodes and memory


class KVPool(Base):
    """One node's paged KV cache on one rank, in blocks. The graph language calls a block a page
    (`kv_cache: {page_tokens, max_pages}`) and plan.bin keeps those names on the wire."""

    rank: int                                                  # rank holding this pool
    num_blocks: int = msgspec.field(name="num_pages")          # blocks in the pool (per rank; TP: a shard of each)
    block_tokens: int = msgspec.field(name="page_tokens")      # tokens per block
    block_bytes: int = msgspec.field(name="block_bytes")        # bytes of one block on this rank (all layers, K and V)


class Placement(Base):
    ranks: list[int]                    # default ranks: TP group (tp_size > 1) or data-parallel replicas
    tp_size: int = 1                    # tensor-parallel degree; divides every KindSpec.tp_divides dim
    walk_ranks: dict[str, list[int]] = {}  # walk name -> ranks for that walk (same tp_size)


class Rename(Base):
    match: str                          # regex searched in a tensor name (re.sub)
    to: str                             # replacement (\1 for groups)


class IndexRemap(Base):
    match: str                          # regex whose first group is an integer index in the name
    count: int                          # indices 0..count-1 map to count-1-i (FLUX counts up-blocks from the bottom)


class Split(Base):
    match: str                          # regex (full match) of a fused tensor's name after `rename`
    into: list[str]                     # one replacement name per equal chunk along `dim` (e.g. q, k, v)
    dim: int = 0


class WeightMap(Base):
    """Where one node's weights come from in a published checkpoint, and how names and shapes map.

    Applied per tensor in this order: `prefix` (tensors without it belong to other nodes), `exclude`,
    `index_remap`, `rename`, `split`; then `reshape` when loading (the module's shape, same element
    count). The result must name exactly the module's slots (runtime.model_executor.weights.slots)."""

    source: str                         # published repository "owner/name": read from --weights ROOT/<name>
    files: list[str] = []               # file names in the repository ([]: the index's shards or every .safetensors)
    prefix: str = ""                    # only tensors starting with it, the prefix stripped
    exclude: list[str] = []             # regexes (after the prefix strip) of tensors this node does not read
    optional: list[str] = []            # regexes (mapped names) that may be absent or present and are then skipped
    index_remap: list[IndexRemap] = []
    rename: list[Rename] = []
    split: list[Split] = []
    reshape: list[str] = []             # regexes (mapped names): view as the module's shape (1x1 conv -> linear)
    config: dict[str, str] = {}         # dotted key in the repository's `config_file` -> node dim it must equal
    config_file: str = "config.json"    # the repository's JSON config `config` reads (BAGEL: llm_config.json, ...)
    # What the library that defines the config format takes where the file lacks a key (older releases
    # serialise fewer keys): `config_defaults` when the key is absent, `config_derive` (an expression over
    # the keys beside it, mstar_compiler.config_expr) when it is absent or null; `config_library` names the
    # library, version and class they come from ("transformers 5.25.0 Qwen3OmniMoeConfig").
    config_defaults: dict[str, Any] = {}
    config_derive: dict[str, str] = {}
    config_library: str = ""


class Node(Base):
    name: str                           # node name in the graph
    kind: str                           # catalogue kind (its family names the class implementing it)
    preset: str                         # kind preset name the dims come from
    dims: dict[str, Any]                # preset dims (+ node `dims:` overrides); what the module is built from
    args: dict[str, Any]                # constant args (kind defaults + YAML `args:`)
    param_args: dict[str, str]          # arg name -> request param name; resolved per request
    weight_key: str                     # name of the node owning the weights (itself unless same_as)
    dtype: str                          # weight/activation dtype: "fp32" | "bf16" | "fp16"
    num_params: int                     # catalogue num_params(dims)
    weight_bytes: int                   # num_params * dtype bytes (whole model, before TP split)
    placement: Placement
    inputs: list[Port]
    outputs: list[Port]
    has_kv_cache: bool                  # keeps a paged per-request KV cache
    kv_pools: list[KVPool]              # one per rank it runs on ([] when has_kv_cache is False)
    can_batch: bool                     # several requests may share one call
    max_batch: int                      # largest batch the conductor may form for this node
    is_capture_safe: bool               # static shapes per batch bucket
    source: str                         # "file:line:col" of the node's declaration (for messages)
    # where the weights come from, as written in the graph preset's `weights:` (None: seeded random):
    # a safetensors file or directory, a .gguf file, or "gguf:<package>[/<file>]", a GGUF file inside an installed
    # Python package (resolved by the runtime, never downloaded)
    weights: str | None = None
    # the graph's declared mapping from a published repository (preset `weights:` given as a mapping)
    weight_map: WeightMap | None = None
    # seeded random weights are allowed when no weights are given (the preset says `random_weights: true`)
    random_weights: bool = False
    # the runtime executor that runs the node: a name a family declares (`Family.executors`) or "stateless",
    # the kind's default from the catalogue unless the graph's `executor:` names another
    executor: str = ""
    # a streaming consumer's first Run waits for this many chunks (catalogue `first_run_chunks`)
    first_run_chunks: int = 1
    # where the graph preset's `layers:` built the node with fewer layers than its kind preset has: the count
    # it is built with and the kind preset's (0, 0: all of them)
    declared_layers: int = 0
    published_layers: int = 0
    # weight-only quantization of its decoder linears ("int8", "int4_g32"; "" = none): graph `quant:`
    quant: str = ""


# ---------------------------------------------------------------- dataflow


class Edge(Base):
    walk: str                           # walk in which this edge carries data
    src_node: str
    src_port: str
    dst_node: str
    dst_port: str
    is_implied: bool                    # True: implied by Sequential order; False: declared in `edges:`


class RequestInput(Base):
    walk: str                           # walk whose Run of `node` reads it
    node: str
    port: str
    dtype: str                          # what the request supplies (tokens from text, image, audio, ...)
    optional: bool = False              # the port may stay empty (e.g. no image in this request)


class Transfer(Base):
    kind: str                           # "edge" (an output tensor) | "kv" (a request's KV cache) | "stream"
    walk: str                           # walk of the edge ("" for kv/stream)
    src_node: str
    src_port: str                       # "" for kv
    dst_node: str
    dst_port: str                       # "" for kv
    src_rank: int
    dst_rank: int


class ChunkPolicy(Base):
    kind: str                           # "fixed" | "sliding" | "left_context" | "delimited"
    size: int                           # fixed: K; sliding: window W; left_context: chunk C; delimited: max characters
    stride: int = 0                     # sliding: S (new items between emits); 0 otherwise
    context: int = 0                    # left_context: L (items of left context prepended); 0 otherwise
    delimiters: list[str] = []          # delimited: the strings that end a clause
    min_size: int = 0                   # delimited: the fewest characters a clause ended by a delimiter has


CLIENT = "client"       # the producer of a client-fed stream (`from: client.<item>`): the request's client


class Stream(Base):
    name: str                           # stream name from `streams:`
    src_node: str                       # CLIENT for a client-fed stream (the server pushes its items)
    src_port: str                       # a stream output port (a client-fed stream: the item's name)
    dst_node: str
    dst_port: str                       # a stream input port
    policy: ChunkPolicy
    capacity: int                       # items the consumer-side buffer holds per request
    src_rank: int                       # producer rank (first rank of its placement); -1 for a client-fed stream
    dst_rank: int                       # consumer rank

    @property
    def is_client_fed(self) -> bool:
        return self.src_node == CLIENT


class TaskStream(Base):
    """Text the client writes in pieces, cut into clauses by a `delimited` policy; each clause is the
    `input` of one request of `task`, run in order (`streams: {name: {from: client.<item>, to: <task>.text}}`)."""

    name: str                           # stream name from `streams:`
    item: str                           # the client-fed item (`from: client.<item>`)
    task: str                           # the task run once per clause
    input: str                          # the request input modality each clause becomes ("text")
    policy: ChunkPolicy                 # kind "delimited"


# ---------------------------------------------------------------- walk programs


class Count(Base):
    """A trip count: `const`, or the request param `param` plus `offset`."""

    const: int | None = None
    param: str | None = None
    offset: int = 0                     # e.g. -1 for `$steps - 1`


class Carry(Base):
    src_node: str                       # output of iteration i ...
    src_port: str
    dst_node: str                       # ... becomes this input of iteration i + 1
    dst_port: str


class LoopOutput(Base):
    node: str
    port: str
    mode: str                           # "each": stream every iteration; "all": return the list; "last": final value


class ExitCond(Base):
    kind: str                           # "eos" | "stop_token" | "horizon"
    node: str = ""                      # eos/stop_token: node whose output is tested ("" for horizon)
    port: str = ""                      # that node's tokens output port
    tokens: list[int] = []              # stop_token: constant token ids
    param: str | None = None            # stop_token: param holding ids; horizon: param holding H
    value: int | None = None            # horizon: constant H


class Run(Base, tag="run"):
    node: str
    ranks: list[int]                    # ranks for this walk (TP group or replicas)


class Parallel(Base, tag="parallel"):
    branches: list[list[Run]]           # each branch a straight-line sequence; all get the same input


class LoopBegin(Base, tag="loop_begin"):
    loop: int                           # loop id, unique within the walk
    count: Count
    end: int                            # pc of the matching LoopEnd
    carries: list[Carry]
    outputs: list[LoopOutput]


class LoopEnd(Base, tag="loop_end"):
    loop: int
    begin: int                          # pc of the matching LoopBegin


class DynamicLoopBegin(Base, tag="dynamic_loop_begin"):
    loop: int
    max: Count                          # upper bound on iterations (exit reason "max")
    until: list[ExitCond]               # checked in order after each iteration
    end: int
    carries: list[Carry]
    outputs: list[LoopOutput]


class DynamicLoopEnd(Base, tag="dynamic_loop_end"):
    loop: int
    begin: int


Op = Union[Run, Parallel, LoopBegin, LoopEnd, DynamicLoopBegin, DynamicLoopEnd]


def program_runs(ops: list[Op]) -> list[Run]:
    """The Runs of `ops` in order, Parallel branches flattened; control ops are skipped."""
    out: list[Run] = []
    for op in ops:
        if isinstance(op, Run):
            out.append(op)
        elif isinstance(op, Parallel):
            out += [r for branch in op.branches for r in branch]
    return out


class Walk(Base):
    name: str
    program: list[Op]                   # flat; pc = index
    outputs: list[LoopOutput]           # values the walk returns to the client (mode "last" outside loops)
    nodes: list[str]                    # every node the walk runs (graph order)


# ---------------------------------------------------------------- tasks


class Cond(Base):
    """A transition condition. kind "always" | "param" | "input" | "exit"."""

    kind: str
    param: str = ""                     # kind "param": request param name
    op: str = ""                        # kind "param": "eq" | "ne" | "lt" | "le" | "gt" | "ge"
    value: Any = None                   # kind "param": value compared against
    modality: str = ""                  # kind "input": the request has an input of this dtype
    reason: str = ""                    # kind "exit": last loop exit reason ("eos", "stop_token", "horizon", "max")
    negate: bool = False                # true: the condition is "not ..."


class Transition(Base):
    cond: Cond
    target: int                         # state index in the track, or DONE


class State(Base):
    index: int
    walk: str | None                    # walk to run (None: for_each or pure branch state)
    for_each: dict[str, list[str]] | None  # input modality -> walks: run them, in order, per request input item
    transitions: list[Transition]       # tried in order after the state finishes


class Track(Base):
    name: str
    states: list[State]                 # state 0 is the start
    per_chunk: str | None = None        # stream name: run the walk of state 0 per released chunk


class Task(Base):
    name: str
    tracks: list[Track]                 # run concurrently; the task ends when all are DONE


class CaptureRegion(Base):
    walk: str
    loop: int                           # loop id in that walk
    rank: int
    nodes: list[str]                    # nodes of the body, program order
    batch_buckets: list[int]            # capture one graph per bucket; pad batches up to the next bucket


# ---------------------------------------------------------------- the plan


class CascadeStage(Base):
    role: str                           # "transcribe" (audio in, text out) | "chat" (text in and out) | "speak"
    task: str                           # the task it runs, often an included model's (`asr.chat`)
    clauses: ChunkPolicy | None = None  # speak: how the text before it is cut ("delimited"); None: whole


class Cascade(Base):
    """A task of tasks (`tasks: {name: {cascade: [...]}}`), run by the server: each stage a request of its
    task, the text one stage writes detokenised by its model and read by the next stage's model as its
    own prompt (a spoken stage: one request per clause, spoken in order while the text is written)."""

    name: str
    stages: list[CascadeStage]


class IncludedModel(Base):
    """A graph file compiled into this plan under a name (`include:`): its nodes, walks, tasks, params and
    streams are named `<name>.<theirs>` in the plan."""

    name: str                           # the include's name (nested: `outer.inner`)
    model: str                          # its graph's `model:`
    source: str                         # its graph file name (basename)
    preset: str                         # its graph preset compiled
    placement: str                      # its placement profile compiled
    default_task: str                   # its default task (prefixed)


class Plan(Base):
    format_version: int                 # FORMAT_VERSION at compile time
    model: str                          # graph `model:` name
    source: str                         # graph file name (basename)
    source_sha256: str                  # hex digest of the graph file's text (and, after a NUL each, its includes')
    preset: str                         # graph-level preset compiled
    placement: str                      # placement profile compiled
    ranks: list[Rank]
    params: list[Param]
    nodes: list[Node]
    edges: list[Edge]
    request_inputs: list[RequestInput]
    walks: list[Walk]
    tasks: list[Task]
    default_task: str                   # task used when a request names none
    transfers: list[Transfer]
    streams: list[Stream]
    capture_regions: list[CaptureRegion]
    task_streams: list[TaskStream] = []  # client text streamed into a task, a clause per request
    models: list[IncludedModel] = []    # graphs included under a name (`include:`; an include's own first)
    cascades: list[Cascade] = []        # tasks of tasks the server runs (`cascade:`), not the conductor

    def include_of(self, name: str) -> str:
        """The innermost include declaring `name` (a node, walk, task, stream or param): "" for the plan's own."""
        return max((m.name for m in self.models if name.startswith(m.name + ".")), key=len, default="")

    def cascade(self, name: str) -> Cascade | None:
        return next((c for c in self.cascades if c.name == name), None)

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def walk(self, name: str) -> Walk:
        return next(w for w in self.walks if w.name == name)

    def task(self, name: str) -> Task:
        return next(t for t in self.tasks if t.name == name)

    def tp_ranks(self, rank: int) -> list[int] | None:
        """The ranks of the one tensor-parallel group `rank` belongs to (None: no group)."""
        groups = {tuple(ranks) for node in self.nodes if node.placement.tp_size > 1
                  for ranks in (node.placement.ranks, *node.placement.walk_ranks.values()) if rank in ranks}
        if len(groups) > 1:
            raise ValueError(f"rank {rank} is in several tensor-parallel groups {sorted(groups)}; a worker joins one")
        return list(groups.pop()) if groups else None


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Plan)


def dump_plan(plan: Plan) -> bytes:
    """The bytes of `plan.bin` for `plan`: header + msgpack payload."""
    payload = _ENCODER.encode(plan)
    return _HEADER.pack(MAGIC, FORMAT_VERSION, hashlib.sha256(payload).digest()) + payload


def loads_plan(data: bytes, where: str = "<bytes>") -> Plan:
    """Parse plan bytes; raises PlanFormatError with a message for people."""
    if len(data) < _HEADER.size or data[:8] != MAGIC:
        raise PlanFormatError(f"{where}: not an mstar plan (bad magic); compile one with `mstarc compile`")
    _, version, digest = _HEADER.unpack_from(data)
    if version != FORMAT_VERSION:
        raise PlanFormatError(
            f"{where}: plan format version {version}, this mstar reads version {FORMAT_VERSION}; "
            "recompile the graph with this mstarc"
        )
    payload = data[_HEADER.size:]
    if hashlib.sha256(payload).digest() != digest:
        raise PlanFormatError(f"{where}: checksum mismatch, the plan file is corrupt; recompile it")
    try:
        return _DECODER.decode(payload)
    except msgspec.DecodeError as exc:
        raise PlanFormatError(f"{where}: malformed plan payload ({exc}); recompile it") from None


def load_plan(path: str | Path) -> Plan:
    """Read and verify `plan.bin` (the runtime's one call)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PlanFormatError(f"{path}: cannot read plan ({exc.strerror})") from None
    return loads_plan(data, str(path))
