"""Pass 5, lower: walks to flat programs (see `plan.Walk`), tasks to state tables
(see `plan.Track`). Ranks in `Run` ops are left empty here; `place` fills them.
"""
from __future__ import annotations

from mstar_compiler import plan
from mstar_compiler.ir import (IR, ForEachIR, IfIR, LoopStep, NodeStep, ParStep, Step,
                               TaskStepIR, TrackIR, WalkRunIR)

ALWAYS = plan.Cond(kind="always")


def run(ir: IR) -> IR:
    for name, walk in ir.walks.items():
        program: list[plan.Op] = []
        _lower(walk, program, [0])
        ir.programs[name] = program
    ir.task_tables = [plan.Task(name, [_track(t) for t in task.tracks]) for name, task in ir.tasks.items()]
    return ir


def _lower(step: Step, program: list[plan.Op], next_loop: list[int]) -> None:
    if isinstance(step, NodeStep):
        program.append(plan.Run(step.node, []))
    elif isinstance(step, ParStep):
        program.append(plan.Parallel([[plan.Run(s.node, []) for s in branch] for branch in step.branches]))
    elif isinstance(step, LoopStep):
        _lower_loop(step, program, next_loop)
    else:
        for s in step.steps:
            _lower(s, program, next_loop)


def _lower_loop(loop: LoopStep, program: list[plan.Op], next_loop: list[int]) -> None:
    loop_id = next_loop[0]
    next_loop[0] += 1
    begin = len(program)
    program.append(plan.Run("", []))          # placeholder, replaced below
    _lower(loop.body, program, next_loop)
    end = len(program)
    carries = [c.carry for c in loop.carries]
    outputs = [e.output for e in loop.emits]
    if loop.dynamic:
        program[begin] = plan.DynamicLoopBegin(loop_id, loop.count, list(loop.until), end, carries, outputs)
        program.append(plan.DynamicLoopEnd(loop_id, begin))
    else:
        program[begin] = plan.LoopBegin(loop_id, loop.count, end, carries, outputs)
        program.append(plan.LoopEnd(loop_id, begin))


class _States:
    """Builds a track's states back to front, then numbers them from the start state."""

    def __init__(self) -> None:
        self.states: list[tuple[str | None, dict[str, list[str]] | None, list[tuple[plan.Cond, int]]]] = []

    def add(self, walk: str | None, for_each: dict[str, list[str]] | None,
            transitions: list[tuple[plan.Cond, int]]) -> int:
        self.states.append((walk, for_each, transitions))
        return len(self.states) - 1

    def build(self, steps: list[TaskStepIR], after: int) -> int:
        target = after
        for step in reversed(steps):
            target = self._step(step, target)
        return target

    def _step(self, step: TaskStepIR, after: int) -> int:
        if isinstance(step, WalkRunIR):
            return self.add(step.walk, None, [(ALWAYS, after)])
        if isinstance(step, ForEachIR):
            return self.add(None, {m: list(w) for m, w in step.walks.items()}, [(ALWAYS, after)])
        assert isinstance(step, IfIR)
        then = self.build(step.then, after)
        otherwise = self.build(step.otherwise, after)
        return self.add(None, None, [(step.cond, then), (ALWAYS, otherwise)])

    def numbered(self, start: int) -> list[plan.State]:
        order: list[int] = []
        queue = [start]
        while queue:
            i = queue.pop(0)
            if i == plan.DONE or i in order:
                continue
            order.append(i)
            queue += [t for _, t in self.states[i][2]]
        index = {old: new for new, old in enumerate(order)}
        index[plan.DONE] = plan.DONE
        out = []
        for new, old in enumerate(order):
            walk, for_each, transitions = self.states[old]
            out.append(plan.State(new, walk, for_each, [plan.Transition(c, index[t]) for c, t in transitions]))
        return out


def _track(track: TrackIR) -> plan.Track:
    states = _States()
    start = states.build(track.steps, plan.DONE)
    return plan.Track(track.name, states.numbered(start), track.per_chunk)
