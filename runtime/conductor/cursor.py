"""Interprets one track of a task for one request: states, walk programs, loops, transitions.

The plan lowered every walk to a flat program and every task to state tables, so this is
a small machine with a program counter, not a tree walk. `ready()` lists the `Run`s the
request can do next (several inside a `Parallel`); the conductor batches them across
requests and calls `complete()` when one comes back; `settle()` moves the pc over
control ops (loop begin/end, walk end, state transitions) until it rests on work again
or the track is done.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from mstar_compiler.plan import (
    DONE, Cond, Count, DynamicLoopBegin, DynamicLoopEnd, ExitCond, LoopBegin, LoopEnd,
    Parallel, Plan, Run, Track, Walk,
)
from runtime.transport.request_params import RequestParams


class RequestView(Protocol):
    """What a cursor may read of its request."""

    params: RequestParams
    stop_token_ids: frozenset[int]

    def input_dtypes(self) -> list[str]: ...          # dtype of each request input item, in order
    def last_token(self, key: str) -> int | None: ...  # last id of token value "<node>.<port>"


class PendingRun(msgspec.Struct, frozen=True):
    """One `Run` a request is ready to do (a struct, built in C: one is built per Run per step)."""

    track: int          # track index in the task
    branch: int         # Parallel branch index, -1 outside a Parallel
    run: Run
    walk: str           # walk the Run belongs to
    step: int           # iteration index of the innermost loop (0 outside loops)
    item: int           # request input item the walk is iterating over (for_each), else -1


@dataclass
class _Loop:
    counter: int
    trips: int
    op: LoopBegin | DynamicLoopBegin


@dataclass
class TrackCursor:
    """Program counter and loop state of one track."""

    index: int
    track: Track
    plan: Plan
    state: int = 0
    walk: Walk | None = None
    pc: int = 0
    item: int = -1
    loops: dict[int, _Loop] = field(default_factory=dict)
    branch_pos: list[int] = field(default_factory=list)   # inside a Parallel: next run per branch
    in_flight: set[int] = field(default_factory=set)       # branches (-1: plain Run) dispatched
    exit_reason: str = ""
    forced_exit: str = ""                                  # set by the conductor (stop string)
    _items: list[tuple[int, str]] = field(default_factory=list)  # for_each: (item, walk) still to run

    @property
    def is_done(self) -> bool:
        return self.state == DONE

    # ---- work --------------------------------------------------------------------

    def ready(self) -> list[PendingRun]:
        """Runs that can be dispatched now (none while the current one is in flight)."""
        walk, loops = self.walk, self.loops
        if walk is None or self.state == DONE:
            return []
        op = walk.program[self.pc]
        step = loops[max(loops)].counter if loops else 0    # the innermost loop's
        if type(op) is Run:
            return [] if -1 in self.in_flight else [PendingRun(self.index, -1, op, walk.name, step, self.item)]
        return [PendingRun(self.index, b, op.branches[b][pos], walk.name, step, self.item)
                for b, pos in enumerate(self.branch_pos)
                if pos < len(op.branches[b]) and b not in self.in_flight]

    def start(self, pending: PendingRun) -> None:
        self.in_flight.add(pending.branch)

    def complete(self, pending: PendingRun, req: RequestView) -> None:
        """A dispatched Run came back: move past it and settle."""
        self.in_flight.discard(pending.branch)
        if pending.branch < 0:
            pc, program = self.pc + 1, self.walk.program
            end = program[pc] if pc < len(program) else None
            if type(end) is DynamicLoopEnd and end.begin == pc - 2:
                # a loop whose body is this one Run (a decode loop): its end is the only op to pass,
                # passed here as settle() would (once per row of every decode step)
                if not self.next_iteration(self.loops[end.loop], req):
                    self.leave_loop(end, req)
                return
            self.pc = pc
        else:
            self.branch_pos[pending.branch] += 1
            if self.in_flight or any(p < len(b) for p, b in zip(self.branch_pos, self.walk.program[self.pc].branches)):
                return
            self.pc += 1
        self.settle(req)

    def next_iteration(self, loop: _Loop, req: RequestView) -> bool:
        """Count an iteration of a DynamicLoop whose body is the one Run the pc rests on; whether
        the loop goes on (the pc stays on the Run)."""
        loop.counter += 1
        return loop.counter < loop.trips and not self._exit_reason(loop.op, req)

    def leave_loop(self, end: DynamicLoopEnd, req: RequestView) -> None:
        """The loop of `next_iteration` ends: its exit reason is kept, the pc passes its end and settles."""
        self.exit_reason = self._exit_reason(self.loops[end.loop].op, req) or "max"
        del self.loops[end.loop]
        self.pc += 2
        self.settle(req)

    def requeue(self, pending: PendingRun) -> None:
        """A dispatched Run did not happen (its worker restarted, or it was preempted)."""
        self.in_flight.discard(pending.branch)

    # ---- control flow ------------------------------------------------------------

    def settle(self, req: RequestView) -> None:
        """Advance over control ops until the pc rests on a Run/Parallel or the track is done.
        (Run once per request per step: ops are told apart by their exact type, not isinstance.)"""
        while self.state != DONE:
            walk = self.walk
            if walk is None:
                self._enter_state(req)
                continue
            if self.pc >= len(walk.program):
                self._end_walk(req)
                continue
            op = walk.program[self.pc]
            kind = type(op)
            if kind is Run:
                return
            if kind is Parallel:
                if not self.branch_pos and not self.in_flight:
                    self.branch_pos = [0] * len(op.branches)
                return
            if kind is DynamicLoopEnd or kind is LoopEnd:
                self._loop_end(op, req)
            else:
                self._loop_begin(op, req)
            if self.branch_pos:      # a Parallel's positions end with it
                self.branch_pos = []

    def _loop_begin(self, op: LoopBegin | DynamicLoopBegin, req: RequestView) -> None:
        is_dynamic = type(op) is DynamicLoopBegin
        trips = resolve_count(op.max if is_dynamic else op.count, req.params)
        self.loops[op.loop] = _Loop(0, trips, op)
        exit_now = trips <= 0 or (is_dynamic and self._exit_reason(op, req))
        self.pc = op.end + 1 if exit_now else self.pc + 1
        if exit_now:
            self.exit_reason = self._exit_reason(op, req) if trips > 0 else "max"
            del self.loops[op.loop]

    def _loop_end(self, op: LoopEnd | DynamicLoopEnd, req: RequestView) -> None:
        loop = self.loops[op.loop]
        loop.counter += 1
        reason = self._exit_reason(loop.op, req) if type(op) is DynamicLoopEnd else ""
        if not reason and loop.counter < loop.trips:
            self.pc = op.begin + 1
        else:
            self.exit_reason = reason or "max"
            del self.loops[op.loop]
            self.pc += 1

    def _exit_reason(self, op: LoopBegin | DynamicLoopBegin, req: RequestView) -> str:
        if self.forced_exit:
            return self.forced_exit
        if type(op) is LoopBegin:
            return ""
        counter = self.loops[op.loop].counter
        for cond in op.until:
            if cond.kind == "eos":      # _holds' eos case inline (asked after every decode step)
                if req.last_token(f"{cond.node}.{cond.port}") in req.stop_token_ids:
                    return "eos"
            elif _holds(cond, counter, req):
                return cond.kind
        return ""

    def _enter_state(self, req: RequestView) -> None:
        if not self._items:
            spec = self.track.states[self.state]
            if spec.walk is not None:
                self._items = [(-1, spec.walk)]
            elif spec.for_each is not None:
                self._items = [(i, walk) for i, d in enumerate(req.input_dtypes()) if d in spec.for_each
                               for walk in spec.for_each[d]]    # an item's walks run in order
            if not self._items:
                self._transition(req)
                return
        self.item, name = self._items.pop(0)
        self.walk, self.pc, self.loops, self.branch_pos = self.plan.walk(name), 0, {}, []

    @property
    def is_on_last_item(self) -> bool:
        """Whether the running walk is the state's last: a for_each state runs one walk per input
        item, and only the last item's sampled token follows the whole prompt."""
        return not self._items

    def _end_walk(self, req: RequestView) -> None:
        self.walk = None
        if not self._items:
            self._transition(req)

    def _transition(self, req: RequestView) -> None:
        for t in self.track.states[self.state].transitions:
            if _cond_holds(t.cond, self.exit_reason, req):
                self.state = t.target
                return
        self.state = DONE

    def force_exit(self, reason: str) -> None:
        """End the track now (a stop string matched): the request is complete."""
        self.forced_exit = reason
        self.exit_reason = reason
        self.state, self.walk, self._items = DONE, None, []
        self.in_flight.clear()   # a batch still running for it is ignored when it returns


def resolve_count(count: Count, params: RequestParams) -> int:
    """A plan trip count for one request's params."""
    base = count.const if count.param is None else params.count(count.param)
    return int(base) + count.offset


def _holds(cond: ExitCond, counter: int, req: RequestView) -> bool:
    if cond.kind == "horizon":
        horizon = cond.value if cond.param is None else req.params.count(cond.param)
        return counter >= horizon
    last = req.last_token(f"{cond.node}.{cond.port}")
    if last is None:
        return False
    if cond.kind == "eos":
        return last in req.stop_token_ids
    if last in cond.tokens:
        return True
    value = req.params.declared[cond.param] if cond.param else ()
    return last == value if isinstance(value, int) else last in value   # a param holds one id or a list


def _cond_holds(cond: Cond, exit_reason: str, req: RequestView) -> bool:
    if cond.kind == "always":
        result = True
    elif cond.kind == "param":
        result = _compare(req.params.declared[cond.param], cond.op, cond.value)
    elif cond.kind == "input":
        result = cond.modality in req.input_dtypes()
    else:
        result = exit_reason == cond.reason
    return result != cond.negate


def _compare(a: Any, op: str, b: Any) -> bool:
    ops = {"eq": a == b, "ne": a != b}
    if op in ops:
        return ops[op]
    if a is None:
        return False
    return {"lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b}[op]


__all__ = ["DONE", "PendingRun", "RequestView", "TrackCursor"]
