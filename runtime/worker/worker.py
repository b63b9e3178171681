"""The worker process of one rank: `run_worker(plan_path, rank, conductor_endpoint)`.

Loop: wait for a control message (or cross-rank tensors from another worker); RunBatch ->
gather each item's inputs from this rank's per-request value store, run the node's
executor, push outputs of cross-rank edges straight to the consuming rank, store the rest,
reply BatchDone. RunBatches that arrive together for executors of one `group` (nodes that
share a module, e.g. BAGEL's CFG branches) run as one call. A batch that raises is
answered with BatchFailed and the worker goes on.
Streaming edges (runtime/worker/streams.py): a Run takes its stream chunks with its inputs
and pushes its stream items as soon as it has run, straight to the consuming rank; a client-fed
stream's items arrive from the conductor on the control channel.
A heartbeat thread with its own socket tells the conductor the process is alive even
while a long batch runs (runtime/worker/heartbeat.py).
Joining: Hello (with the address peers reach this rank at, runtime/transport/addresses.py) ->
the conductor's Welcome -> load -> Ready. Tensor parallelism: a rank in a node's TP group joins
it before loading, at the rendezvous the Welcome names (the group lead's address and a port the
lead reserved, decided once by the conductor); a RunBatch marked `follower`
runs in step with the lead but pushes and emits nothing. Disaggregation: MoveKV sends a
request's KV cache of a node to another rank (KVState); a Run with `kv_in` waits for it.
Only requests the conductor opened here are served (runtime/worker/opened.py): a Run of any
other request is answered BatchFailed, tensors for one are dropped (both counted), and a
request whose params an executor refuses at open fails its own Runs, not the worker.
"""
from __future__ import annotations

import functools
import logging
import os
import time
import traceback

import msgspec
import torch
import zmq

from mstar_compiler.plan import load_plan
from runtime.worker.executors import ExecResult, Executor, executor_for
from runtime.transport.addresses import free_port, pin_collectives_to, probe, worker_addresses
from runtime.transport.messages import (
    BatchDone, BatchFailed, CloseRequest, EdgeTensors, Hello, ItemResult, KVState, MoveKV,
    NodeInfo, OpenRequest, PeerUnreachable, Peers, Ready, Rejoin, RunBatch, Shutdown, StreamItems,
    Welcome, WorkItem,
)
from runtime.transport.keys import ClusterKeys, start_guard
from runtime.transport.log_rate import is_worth_logging
from runtime.transport.queues import (
    EdgeInbox, EdgeOutbox, Envelope, MalformedMessage, PeerUnreachableError, WorkerQueue,
)
from runtime.model_executor.weights.sources import WeightOptions
from runtime.worker.heartbeat import heartbeat, start_heartbeat
from runtime.model_executor.sampling import GrammarVocab
from runtime.worker.loader import cpu_kernels_note, load_rank, node_tokenizer, tensor_parallel_group
from runtime.worker.opened import OpenedRequests
from runtime.worker.openmp import ThreadGovernor
from runtime.worker.streams import WorkerStreams

log = logging.getLogger(__name__)
EDGE_WAIT_S = 30.0     # how long a batch waits for a cross-rank input before failing
JOIN_TIMEOUT_S = 120.0  # how long a new worker waits for the conductor's Welcome


class Worker:
    """One rank: executors per node, per-request value store, sockets."""

    def __init__(self, plan_path: str, rank: int, conductor: str, weights: WeightOptions, host: str | None,
                 keys: ClusterKeys | None = None, advertise: str | None = None) -> None:
        self.plan = load_plan(plan_path)
        self.rank = rank
        self.keys = keys
        self.conductor = conductor
        self.ctx = zmq.Context()
        self.guard = start_guard(self.ctx, keys) if keys is not None else None   # ZAP for the inbox
        self.control = WorkerQueue(self.ctx, conductor, rank, keys)
        bind, self.address = worker_addresses(conductor, host, advertise)
        self.inbox = EdgeInbox(self.ctx, bind, self.address, keys)
        self.outbox = EdgeOutbox(self.ctx, keys)
        group = self.plan.tp_ranks(rank)
        self.is_tp = group is not None
        self.control.send(Hello(rank=rank, pid=os.getpid(), peer_endpoint=self.inbox.endpoint,
                                tp_port=free_port(self.address) if group and group[0] == rank else 0))
        # what the heartbeat reads (heartbeat.Beating): empty until built below
        self.executors: dict[str, Executor] = {}
        self.streams: WorkerStreams | None = None
        self.values: dict[int, dict[str, torch.Tensor]] = {}
        self.dropped = 0      # malformed or misaddressed messages dropped (each logged)
        self.governor: ThreadGovernor | None = None
        start_heartbeat(self, conductor)
        welcome = self._await_welcome()
        if self.is_tp:
            pin_collectives_to(self.address)
        tp = tensor_parallel_group(self.plan, rank, welcome.tp_init)
        modules = load_rank(self.plan, rank, weights, tp)
        self.executors = {
            name: executor_for(self.plan.node(name), module, rank, self.plan) for name, (module, _) in modules.items()}
        grammars = {name: ex.take_vocab(GrammarVocab(functools.partial(node_tokenizer, self.plan, name, weights)))
                    for name, ex in self.executors.items()}
        self.kv_incoming: dict[tuple[int, str], Envelope] = {}   # (request, node) -> KVState from another rank
        self.streams = WorkerStreams(self.plan, rank)
        self.requests = OpenedRequests()
        self.backlog: list[Envelope] = []   # control messages read early, while looking for an OpenRequest
        self.ready = Ready(rank=rank, nodes=[
            NodeInfo(name=name, kind=self.plan.node(name).kind, weight_source=source,
                     kv_blocks=self.executors[name].kv_blocks, kv_block_size=self.executors[name].kv_block_size,
                     num_params=sum(p.numel() for p in module.parameters()),
                     kv_prefix_key=self.executors[name].kv_prefix_key,
                     kv_prefix_stop_ids=sorted(self.executors[name].kv_prefix_stop_ids),
                     kv_media_ids=sorted(self.executors[name].kv_media_ids),
                     kv_pool=self.executors[name].kv_pool,
                     prefill_chunks=self.executors[name].chunks_prefill,
                     compiled_buckets=list(self.executors[name].compiled_buckets), grammars=grammars[name],
                     cpu_kernels=cpu_kernels_note(module))
            for name, (module, source) in modules.items()])
        self.governor = ThreadGovernor(torch.get_num_threads(), torch.set_num_threads, fixed=(
            "a tensor-parallel rank (one that dropped a thread would hold back its group)" if self.is_tp else ""))
        self._send_ready()

    def _await_welcome(self) -> Welcome:
        """The conductor's answer to Hello (it waits for the TP group's lead before answering)."""
        start = time.monotonic()
        while time.monotonic() - start < JOIN_TIMEOUT_S:
            if self.control.socket.poll(1000):
                env = self._recv(self.control)
                if env is not None and isinstance(env.msg, Welcome):
                    return env.msg
        raise TimeoutError(f"rank {self.rank}: no answer from the conductor at {self.conductor} after "
                           f"{JOIN_TIMEOUT_S:.0f} s (is that address reachable from this host, and does the server "
                           f"hold this rank's key? under tensor parallelism, has the group's first rank joined?)")

    # ---- loop ----------------------------------------------------------------------

    def serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.control.socket, zmq.POLLIN)
        poller.register(self.inbox.socket, zmq.POLLIN)
        while True:
            ready = dict(poller.poll(0 if self.backlog else None))
            if self.inbox.socket in ready:
                self._receive_edge()
            if (self.backlog or self.control.socket in ready) and not self._handle_queued(self._drain_control()):
                return

    def _drop(self, what: str) -> None:
        """Count and log a message that cannot be served; the worker goes on."""
        self.dropped += 1
        if is_worth_logging(self.dropped):
            log.warning("rank %d: dropped %s (%d dropped so far)", self.rank, what, self.dropped)

    def _recv(self, queue: EdgeInbox | WorkerQueue) -> Envelope | None:
        try:
            return queue.recv()
        except MalformedMessage as exc:
            self._drop(f"a malformed message ({exc})")
            return None

    def _receive_edge(self) -> None:
        env = self._recv(self.inbox)
        if env is not None:
            self._store_edge(env)

    def _drain_control(self) -> list[Envelope]:
        """The backlog and every control message queued behind it (malformed ones dropped)."""
        envs: list[Envelope | None] = [*self.backlog]
        self.backlog = []
        while self.control.socket.poll(0):
            envs.append(self._recv(self.control))
        return [env for env in envs if env is not None]

    def _read_opens(self) -> None:
        """Handle the OpenRequests already queued on the control channel, keeping the rest for
        the loop: the conductor opens a request here before another rank can push to it, but
        that rank's push may be read first (this loop reads the inbox first, and `_pump`
        reads only the inbox)."""
        while self.control.socket.poll(0):
            env = self._recv(self.control)
            if env is not None and isinstance(env.msg, OpenRequest):
                self._open_request(env.msg)
            elif env is not None:
                self.backlog.append(env)

    def _handle_queued(self, envs: list[Envelope]) -> bool:
        """Handle messages in order, except that consecutive RunBatches wait for each other so
        those of one executor group run as one call (they are independent: the conductor
        only sends a batch whose inputs are ready). An OpenRequest only registers params."""
        runs: list[Envelope] = []
        for env in envs:
            refusal = self._refusal(env) if isinstance(env.msg, RunBatch) else None
            if refusal is not None:
                self.control.send(BatchFailed(batch_id=env.msg.batch_id, rank=self.rank, message=refusal))
            elif isinstance(env.msg, RunBatch):
                runs.append(env)
            elif isinstance(env.msg, OpenRequest):
                self._handle(env)
            else:
                self._run_batches(runs)
                runs = []
                if not self._handle(env):
                    return False
        self._run_batches(runs)
        return True

    def _refusal(self, env: Envelope) -> str | None:
        """Why this rank cannot run the RunBatch (None: it can); a misaddressed one is counted as dropped."""
        msg = env.msg
        if msg.node not in self.executors:
            found: tuple[str, bool] | None = (f"node {msg.node!r} is not on rank {self.rank}", True)
        else:
            found = self.requests.batch_problem([i.request_id for i in msg.items], list(env.tensors), self.rank)
        if found is None:
            return None
        problem, misaddressed = found
        if misaddressed:
            self._drop(f"a RunBatch on {msg.node}: {problem}")
        return problem

    def _run_batches(self, envs: list[Envelope]) -> None:
        """Run queued batches; those whose executors share a `group` as one call."""
        started = time.monotonic()
        groups: dict[int, list[Envelope]] = {}
        for env in envs:
            group = None if env.msg.alone else self.executors[env.msg.node].group
            groups.setdefault(id(group) if group is not None else id(env), []).append(env)
        for members in groups.values():
            self._run_batch(members)
        self.governor.after_batch(started)

    def _handle(self, env: Envelope) -> bool:
        msg = env.msg
        if isinstance(msg, OpenRequest):
            self._open_request(msg)
        elif isinstance(msg, CloseRequest):
            self._close(msg)
        elif isinstance(msg, Peers):
            self._set_peers(msg)
        elif isinstance(msg, Rejoin):
            return self._rejoin()
        elif isinstance(msg, Welcome):
            pass   # the answer to a rejoin's Hello: the TP group, if any, is the one already joined
        elif isinstance(msg, MoveKV):
            self._move_kv(msg)
        elif isinstance(msg, StreamItems):
            self._store_edge(env)       # a client-fed stream's item, pushed by the conductor
        elif isinstance(msg, Shutdown):
            return False
        else:
            self._drop(f"a {type(msg).__name__} on the control channel")
        return True

    def _set_peers(self, peers: Peers) -> None:
        """Take the peers' addresses and keys (the inbox admits exactly the ranks' keys the conductor names:
        a restarted Ray rank's new one, not its old); check that each new address takes a TCP connection
        from here and tell the conductor which do not (its log then names the rank and address, not a
        batch 30 s later)."""
        endpoints, publics = peers.endpoints, {r: k.encode() for r, k in peers.keys.items()}
        new = {r: ep for r, ep in endpoints.items() if r != self.rank and self.outbox.endpoint(r) != ep}
        self.outbox.set_peers(endpoints, publics)
        if self.guard is not None and publics:
            self.guard.admission.replace(publics)
        for peer, endpoint in sorted(new.items()):
            reason = probe(endpoint)
            if reason is not None:
                log.error("rank %d cannot reach rank %d at %s: %s", self.rank, peer, endpoint, reason)
                self.control.send(PeerUnreachable(rank=self.rank, peer=peer, endpoint=endpoint, reason=reason))

    def _rejoin(self) -> bool:
        """The conductor gave this rank up (it was silent too long) and failed its requests: forget them
        and join again. A tensor-parallel rank cannot rejoin its group: it exits to be restarted."""
        if self.is_tp:
            log.error("rank %d: given up by the conductor; a tensor-parallel rank cannot rejoin its group, "
                      "exiting (restart this worker and its group)", self.rank)
            return False
        log.warning("rank %d: the conductor had given this rank up; dropping %d requests and rejoining",
                    self.rank, len(self.requests.ids() | set(self.values)))
        self._close(CloseRequest(request_ids=sorted(self.requests.ids() | set(self.values))))
        self.control.send(Hello(rank=self.rank, pid=os.getpid(), peer_endpoint=self.inbox.endpoint))
        self._send_ready()
        return True

    def _send_ready(self) -> None:
        """Ready, with what the rank holds now (a rejoin sends it again)."""
        self.control.send(msgspec.structs.replace(self.ready, held=heartbeat(self)))

    def _open_request(self, msg: OpenRequest) -> None:
        """Register the request with every executor; one that refuses its params fails the request."""
        try:
            for name, ex in self.executors.items():
                if not msg.scope or name.startswith(msg.scope + "."):     # another model's request: not its
                    ex.open(msg.request_id, msg.params.within(self.plan.include_of(name)))
        except Exception as exc:   # a bad param fails its request's Runs, not this worker
            why = f"rank {self.rank} could not open request {msg.request_id}: {type(exc).__name__}: {exc}"
            log.warning("%s", why)
            for ex in self.executors.values():
                ex.close(msg.request_id, kv_only=False)
            self.requests.fail(msg.request_id, why)
            return
        self.requests.open(msg.request_id)

    def _close(self, msg: CloseRequest) -> None:
        for rid in msg.request_ids:
            for name, ex in self.executors.items():
                if not msg.nodes or name in msg.nodes:
                    ex.close(rid, kv_only=msg.kv_only)
            if not msg.kv_only:
                self.requests.close(rid)
                self.values.pop(rid, None)
                self.streams.free(rid)
                self.kv_incoming = {k: e for k, e in self.kv_incoming.items() if k[0] != rid}

    def _move_kv(self, msg: MoveKV) -> None:
        """Send the request's KV cache of the node to the rank that runs the node next."""
        if msg.node not in self.executors:
            self._drop(f"a MoveKV of node {msg.node!r}, which rank {self.rank} does not run")
            return
        exported = self.executors[msg.node].export_kv(msg.request_id)
        if exported is None:
            log.warning("rank %d: no KV of request %d on %s to move", self.rank, msg.request_id, msg.node)
            exported = (KVState(request_id=msg.request_id, node=msg.node, num_tokens=0), {})
        try:
            self.outbox.send(msg.dst_rank, *exported)
        except PeerUnreachableError as exc:   # the conductor fails the request now, naming the peer
            log.error("rank %d: moving request %d's KV cache failed: %s", self.rank, msg.request_id, exc)
            self.control.send(PeerUnreachable(rank=self.rank, peer=msg.dst_rank, endpoint=self.outbox.endpoint(
                msg.dst_rank) or "", reason=str(exc), request_id=msg.request_id))

    def _receive_kv(self, node: str, item: WorkItem) -> None:
        """Wait for the item's KV cache from the rank that held it and hand it to the executor."""
        deadline = time.monotonic() + EDGE_WAIT_S
        while (item.request_id, node) not in self.kv_incoming:
            if time.monotonic() > deadline:
                raise TimeoutError(f"request {item.request_id}: the KV cache of {node} never arrived")
            self._pump()
        env = self.kv_incoming.pop((item.request_id, node))
        if env.msg.num_tokens:
            self.executors[node].import_kv(env.msg, env.tensors)

    def _store_edge(self, env: Envelope) -> None:
        """Keep a pushed value under its versioned key ("<node>.<port>#<n>"), dropping older versions;
        a push that names nothing this rank consumes is dropped."""
        msg = env.msg
        problem = self._edge_problem(msg, env.tensors)
        if problem:
            self._drop(f"a {type(msg).__name__} from another rank: {problem}")
        elif isinstance(msg, EdgeTensors):
            store = self.values.setdefault(msg.request_id, {})
            for key, tensor in env.tensors.items():
                base = key.split("#", 1)[0] + "#"
                for old in [k for k in store if k.startswith(base)]:
                    del store[old]
                store[key] = tensor
        elif isinstance(msg, StreamItems):
            self.streams.receive(msg.request_id, msg.stream, msg.index, env.tensors)
        elif isinstance(msg, KVState):
            self.kv_incoming[(msg.request_id, msg.node)] = env

    def _edge_problem(self, msg: object, tensors: dict[str, torch.Tensor]) -> str:
        """Why a worker-to-worker message cannot be stored here ("" when it can)."""
        problem = self._edge_shape_problem(msg, tensors)
        if not problem and msg.request_id not in self.requests:
            self._read_opens()
            if msg.request_id not in self.requests:
                problem = f"request {msg.request_id} is not open on rank {self.rank} (never opened, or closed)"
        return problem

    def _edge_shape_problem(self, msg: object, tensors: dict[str, torch.Tensor]) -> str:
        if isinstance(msg, EdgeTensors):
            bad = [k for k in tensors if "#" not in k or "." not in k.split("#", 1)[0]]
            return f"value keys {bad} are not '<node>.<port>#<n>'" if bad else ""
        if isinstance(msg, StreamItems):
            return "" if msg.stream in self.streams.consumed else f"rank {self.rank} consumes no stream {msg.stream!r}"
        if isinstance(msg, KVState):
            return "" if msg.node in self.executors else f"rank {self.rank} does not run node {msg.node!r}"
        return "it is no worker-to-worker message"

    # ---- batches -------------------------------------------------------------------

    def _run_batch(self, envs: list[Envelope]) -> None:
        """Run one batch, or several of one executor group as one call; answer each."""
        msgs = [env.msg for env in envs]
        try:
            for env in envs:
                for key, t in env.tensors.items():
                    rid, name = key.split("/", 1)
                    self.values.setdefault(int(rid), {})[name] = t
            for m in msgs:
                for item in m.items:
                    if item.kv_in:
                        self._receive_kv(m.node, item)
            calls = [(self.executors[m.node], m.items, [self._inputs(item) for item in m.items]) for m in msgs]
            start = time.perf_counter()
            if len(calls) == 1:
                results = [calls[0][0].run(calls[0][1], calls[0][2])]
            else:
                results = calls[0][0].group.run_group(calls)
            run_ms = (time.perf_counter() - start) * 1e3
            emitted = [self._route_and_store(m.node, m.items, r, m.follower) for m, r in zip(msgs, results)]
            streamed = [[self.streams.send(item, r.outputs, self.outbox.send) if item.stream_out and not m.follower
                         else []
                         for item, r in zip(m.items, rs)] for m, rs in zip(msgs, results)]
        except Exception as exc:   # the batch fails, the worker keeps serving
            nodes = ", ".join(m.node for m in msgs)
            log.error("rank %d: batch on %s failed:\n%s", self.rank, nodes, traceback.format_exc())
            message = f"{type(exc).__name__}: {exc}"
            for m in msgs:
                self.control.send(BatchFailed(batch_id=m.batch_id, rank=self.rank, message=message))
            return
        for m, batch_results, tensors, fed in zip(msgs, results, emitted, streamed):
            items = [ItemResult(request_id=item.request_id, tokens=r.tokens, logprobs=r.logprobs,
                                 finished=r.finished, streamed=s)
                     for item, r, s in zip(m.items, batch_results, fed)]
            self.control.send(BatchDone(batch_id=m.batch_id, rank=self.rank, items=items, run_ms=run_ms), tensors)

    def _inputs(self, item: WorkItem) -> dict[str, torch.Tensor]:
        """Input tensors by port; waits for ones still travelling from another rank."""
        deadline = time.monotonic() + EDGE_WAIT_S
        store = self.values.setdefault(item.request_id, {})
        while any(key not in store for key in item.inputs.values()):
            if time.monotonic() > deadline:
                missing = [k for k in item.inputs.values() if k not in store]
                raise TimeoutError(f"request {item.request_id}: inputs {missing} never arrived from their rank")
            self._pump()
            store = self.values.setdefault(item.request_id, {})
        inputs: dict = {port: store[key] for port, key in item.inputs.items()}
        if item.stream_in:
            inputs.update(self.streams.take(item, self._pump, EDGE_WAIT_S))   # stream ports: [Chunk, ...]
        return inputs

    def _pump(self) -> None:
        """Wait up to 100 ms for one message from another rank and store it."""
        if self.inbox.socket.poll(100):
            self._receive_edge()

    def _route_and_store(self, node: str, items: list[WorkItem], results: list[ExecResult],
                         follower: bool = False) -> dict[str, torch.Tensor]:
        emitted: dict[str, torch.Tensor] = {}
        for item, result in zip(items, results):
            store = self.values.setdefault(item.request_id, {})
            for port, t in result.outputs.items():
                store[f"{node}.{port}"] = t
            if follower:     # the group's lead pushes and emits
                continue
            for route in item.routes:
                self.outbox.send(route.rank, EdgeTensors(request_id=item.request_id, tensors=[]),
                                 {route.key: result.outputs[route.port]})
            for port in item.emit:
                if port in result.outputs:   # a node may produce nothing on a port this step (codec EOS)
                    emitted[f"{item.request_id}/{node}.{port}"] = result.outputs[port]
        return emitted

    def close(self) -> None:
        self.control.close()
        self.inbox.close()
        self.outbox.close()
        if self.guard is not None:
            self.guard.stop()


def run_worker(plan_path: str, rank: int, conductor: str, weights: WeightOptions | None = None,
               host: str | None = None, key_file: str | None = None, advertise: str | None = None) -> None:
    """Entry point of `mstar-run worker`: serve `rank` of the plan until told to shut down.
    `key_file` holds the rank's CURVE keys (`mstar-run keygen`); without it the worker speaks
    plain ZeroMQ, which a server (always CURVE) refuses."""
    keys = ClusterKeys.load(key_file) if key_file else None
    if keys is not None:
        keys.check_rank(rank)
    worker = Worker(plan_path, rank, conductor, weights or WeightOptions(), host, keys, advertise)
    log.info("rank %d ready (pid %d)", rank, os.getpid())
    try:
        worker.serve()
    finally:
        worker.close()
