"""Every message between the conductor and the workers, and between workers.

Each message is a msgspec Struct tagged with its `type`, msgpack-encoded as the first
frame of a ZeroMQ multipart message; tensors travel as raw frames after it, described
by the message's `tensors` headers in order (see `frames`). Never pickle.

Who sends what:
  worker -> conductor: Hello (joined), Ready (nodes loaded), BatchDone / BatchFailed, Heartbeat,
      PeerUnreachable (a peer's inbox did not answer a connect)
  conductor -> worker: Welcome (the answer to Hello: where its tensor-parallel group meets),
      Rejoin (a rank given up as dead speaks again: reset and join anew),
      Peers (where every rank listens for tensors, with its public key), OpenRequest (a
      request's full data, once per rank), RunBatch (one node, many requests; only diffs),
      CloseRequest (free every resource of these requests), MoveKV (hand a request's KV
      cache of one node to another rank), Shutdown
  worker -> worker:    EdgeTensors (outputs of a cross-rank edge, pushed straight to the
      consumer rank, never through the conductor); StreamItems (one item of a streaming
      edge, pushed as produced to the rank that buffers it); KVState (a request's KV cache
      of one node, sent by the rank that held it to the rank that runs the node next)
"""
from __future__ import annotations

from typing import Union

import msgspec

from runtime.transport.frames import TensorMeta
from runtime.transport.request_params import RequestParams


class _Msg(msgspec.Struct, tag_field="type", omit_defaults=True):
    """Base of all messages; the wire tag is the class's `tag`."""


class Hello(_Msg, tag="hello"):
    """A worker process has started and connected."""

    rank: int               # which rank of the plan this worker serves
    pid: int                # OS process id (the conductor watches local ones)
    peer_endpoint: str      # where this worker's PULL socket for EdgeTensors listens (an address peers reach)
    tp_port: int = 0        # lead of a tensor-parallel group: a free port on its address for the rendezvous


class Welcome(_Msg, tag="welcome"):
    """The conductor's answer to Hello; the worker loads its nodes only after it."""

    tp_init: str = ""       # tcp://LEAD_HOST:PORT where the rank's TP group meets ("" : no group)


class Rejoin(_Msg, tag="rejoin"):
    """The conductor gave this rank up as dead (silent past the heartbeat timeout) and hears it
    again: drop every request's state and send Hello and Ready anew."""


class PeerUnreachable(_Msg, tag="unreachable"):
    """A worker could not open a connection to another rank's inbox."""

    rank: int               # the rank that tried
    peer: int               # the rank it tried to reach
    endpoint: str           # the address that peer advertised
    reason: str             # the connect error and how long it waited
    request_id: int = -1    # the request whose push failed (-1: the check when the peer joined)


class NodeInfo(msgspec.Struct, omit_defaults=True):
    """One loaded node as its worker reports it."""

    name: str               # node name in the plan
    kind: str               # component kind
    weight_source: str      # "seed:<n>" (random init) or the checkpoint path the weights came from
    kv_blocks: int = 0      # KV pool size in blocks (0: the node keeps no KV cache)
    kv_block_size: int = 0  # tokens per KV block
    num_params: int = 0     # parameters this rank holds for the node (a tensor-parallel shard holds a part)
    kv_prefix_key: str = ""  # hex root key of the node's prefix cache ("": it caches no prefixes)
    kv_prefix_stop_ids: list[int] = []  # placeholder ids: a prompt holding one is not cached from it on
    kv_media_ids: list[int] = []  # placeholder ids the conductor names by the media item a Run reads
                                  # (runtime/conductor/media_keys.py); they stop caching only elsewhere
    prefill_chunks: bool = False  # its executor takes a prompt in chunks (`WorkItem.partial`)
    compiled_buckets: list[int] = []  # batch buckets of its inductor-compiled CPU decode steps ([]: eager)
    cpu_kernels: str = ""   # a decoder LM on CPU: "fused" (runtime/model_executor/kernels/cpu.py) or why its layers run torch ops
    kv_pool: str = ""       # the node whose pool holds this node's tables, when several nodes' KV lives in
                            # one cache (BAGEL's CFG branches; runtime/conductor/kv_ledger.py); "": its own
    grammars: bool = False  # it samples under a request's grammar (response_format, forced tool calls)


class Ready(_Msg, tag="ready"):
    """A worker has loaded all of its nodes and can run batches."""

    rank: int
    nodes: list[NodeInfo]
    held: Heartbeat | None = None       # what the rank holds as it turns ready (/metrics has it from then on)


class Peers(_Msg, tag="peers"):
    """Where each rank listens for EdgeTensors, and the key it serves that inbox with (sent whenever a
    rank (re)joins, over the authenticated control channel; a restarted Ray rank brings a new key)."""

    endpoints: dict[int, str]   # rank -> tcp://host:port
    keys: dict[int, str] = {}   # rank -> its CURVE public key (z85): a pusher dials with it, an inbox admits it


class OpenRequest(_Msg, tag="open"):
    """A request's full data, sent once to every rank that will run one of its nodes."""

    request_id: int
    params: RequestParams       # the request's params as the server resolved them
    scope: str = ""             # the include its task belongs to: only its nodes open it ("": every node)


class Route(msgspec.Struct, array_like=True):
    """After running, push output `port` of the node to `rank` (a cross-rank edge)."""

    port: str               # output port of the node being run
    rank: int               # consumer rank
    key: str                # value key the consumer stores it under ("<node>.<port>#<run count>")


class StreamRoute(msgspec.Struct, array_like=True):
    """After running, push this Run's item of streaming edge `stream` to the consumer rank."""

    stream: str             # stream name in the plan
    port: str               # output port of the node being run (the stream's source port)
    rank: int               # rank holding the consumer-side buffer
    index: int              # position of this Run's item in the stream (0, 1, ...)


class StreamTake(msgspec.Struct, array_like=True):
    """Before running, take `num_chunks` chunks of streaming edge `stream` as input `port`."""

    stream: str
    port: str               # input port of the node being run (the stream's destination port)
    num_chunks: int         # chunks to take (0: none; the stream is already drained)
    num_items: int          # items the producer had pushed when the conductor decided: wait for them
    is_finished: bool       # the producer has ended after `num_items` items: flush the remainder


class WorkItem(msgspec.Struct, omit_defaults=True):
    """One request's share of a batch: only what changed since the last step (diffs)."""

    request_id: int
    tokens: list[int] = []      # new input token ids (whole prompt chunk at prefill, one at decode)
    inputs: dict[str, str] = {}  # input port -> value key in the worker's per-request store
    routes: list[Route] = []    # cross-rank edges fed by this node's outputs for this request
    step: int = 0               # iteration index of the enclosing loop (seeds per-step sampling)
    emit: list[str] = []        # output ports whose values go back to the conductor
    walk: str = ""              # walk this Run belongs to (a node may do different work per walk)
    stream_in: list[StreamTake] = []    # streaming-edge chunks this Run consumes
    stream_out: list[StreamRoute] = []  # streaming edges this Run's output feeds
    kv_in: bool = False         # the request's KV cache of this node arrives from another rank first
    cached: int = 0             # leading `tokens` already in this rank's prefix cache: reuse, compute the rest
    partial: bool = False       # a prompt chunk with more of the prompt to follow (chunked prefill):
                                # cache its keys/values, sample nothing
    kv_at: int = -1             # the request's KV block table changed from this index on (-1: unchanged) ...
    kv_blocks: list[int] = []   # ... to these block ids: table[kv_at:] = kv_blocks (the conductor allocates them)
    kv_copies: list[tuple[int, int]] = []   # (src, dst) blocks to copy before the Run writes (copy-on-write)
    kv_rows: int = -1           # rows the conductor grew the table by, where its family lays them out
                                # (`Family.kv_rows`; -1: the Run's tokens): the worker checks it writes as many


class RunBatch(_Msg, tag="run"):
    """Run one node over a batch of requests."""

    batch_id: int
    node: str
    items: list[WorkItem]
    tensors: list[TensorMeta] = []  # frames the conductor attaches (request inputs, e.g. pixels);
                                    # name is "<request_id>/<value key>"
    follower: bool = False          # a tensor-parallel follower: run in step with the group's lead,
                                    # push nothing and emit nothing (the lead does)
    alone: bool = False             # run as its own call, never merged with other queued batches


class TokenLogprob(msgspec.Struct, array_like=True):
    """The model's log-probabilities at one sampled token (a request that asked for `logprobs`)."""

    logprob: float                  # log p(the sampled token), of the raw distribution
    top_ids: list[int] = []         # the request's top_logprobs most likely ids, most likely first
    top_logprobs: list[float] = []  # their log-probabilities, in the same order


class ItemResult(msgspec.Struct, omit_defaults=True):
    """One request's outcome of a batch."""

    request_id: int
    tokens: list[int] = []      # token ids produced (sampled) this step
    logprobs: list[TokenLogprob] = []   # one per token when the request asked for logprobs, else empty
    finished: str = ""          # the node says this request's loop may stop ("eos"), else ""
    streamed: list[str] = []    # streams this Run pushed an item onto (0 or 1 item each)


class BatchDone(_Msg, tag="done"):
    """A batch ran; emitted tensors follow as frames named "<request_id>/<port>"."""

    batch_id: int
    rank: int
    items: list[ItemResult]
    tensors: list[TensorMeta] = []
    run_ms: float = 0.0         # wall time of the node's forward, milliseconds


class BatchFailed(_Msg, tag="failed"):
    """A batch raised; the requests in it fail, the worker keeps serving."""

    batch_id: int
    rank: int
    message: str


class CloseRequest(_Msg, tag="close"):
    """Free resources of these requests on this rank: everything, or only KV blocks (preemption)."""

    request_ids: list[int]
    kv_only: bool = False       # True: free KV blocks only (preempted; sampling state is kept)
    nodes: list[str] = []       # restrict to these nodes ([]: every node of the rank)


class MoveKV(_Msg, tag="move_kv"):
    """Send this request's KV cache of `node` to `dst_rank` (it runs the node next), then free it here."""

    request_id: int
    node: str
    dst_rank: int


class Heartbeat(_Msg, tag="heartbeat"):
    """A worker is alive (sent every second while idle or busy)."""

    rank: int
    kv_used_blocks: dict[str, int] = {}   # node -> KV blocks its requests hold on this rank
    stream_buffers: int = 0               # consumer-side stream buffers held (one per request and stream)
    value_stores: int = 0                 # requests whose values (inputs, outputs) this rank stores
    dropped_messages: int = 0             # messages this rank dropped as malformed or naming nothing it holds
    refused_peers: int = 0                # handshakes this rank's inbox refused (no or unknown CURVE key)
    start_steps: int = 0                  # start steps done (weights loaded, decode steps compiled, ...)
    start_last: str = ""                  # the latest of them
    threads: int = 0                      # OpenMP threads the rank runs now (runtime/worker/openmp.py's governor)
    threads_allotted: int = 0             # ... of those it was given
    # False: liveness and start progress only (the worker has not built its executors yet, or its tables
    # kept changing under the read); the conductor then keeps the numbers it has for the rank
    counted: bool = True


class Shutdown(_Msg, tag="shutdown"):
    """The worker should exit after its current batch."""


class EdgeTensors(_Msg, tag="edge"):
    """Worker -> worker: outputs of a cross-rank edge for one request; frames follow."""

    request_id: int
    tensors: list[TensorMeta]   # names are value keys ("<node>.<port>")


class StreamItems(_Msg, tag="stream"):
    """Worker -> worker: one item of a streaming edge for one request; frames follow."""

    request_id: int
    stream: str
    index: int                  # the item's position in the stream
    tensors: list[TensorMeta] = []   # the item's named parts ("value", and e.g. "ids")


class KVState(_Msg, tag="kv"):
    """Worker -> worker: a request's KV cache of one node and its sampling state; frames follow
    ("k", "v": (layers, blocks, block_size, kv_heads, head_dim); "rng": generator state)."""

    request_id: int
    node: str
    num_tokens: int             # tokens the cache holds
    prompt_ids: list[int] = []  # the sampling state's token history
    output_ids: list[int] = []
    tensors: list[TensorMeta] = []


Message = Union[
    Hello, Welcome, Rejoin, PeerUnreachable, Ready, Peers, OpenRequest, RunBatch, BatchDone, BatchFailed,
    CloseRequest, MoveKV, Heartbeat, Shutdown, EdgeTensors, StreamItems, KVState,
]

_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Message)


def encode(msg: Message) -> bytes:
    """msgpack bytes of a message."""
    return _ENCODER.encode(msg)


def decode(data: bytes | memoryview) -> Message:
    """The typed message in `data`; raises msgspec.ValidationError on a malformed one."""
    return _DECODER.decode(data)
