"""One included model of a composed plan, seen as its clients see it (`mstar-run` serves each under its name).

A plan compiled from a graph with `include:` names everything an included graph declares
`<include>.<name>`. Its clients know none of that: a chat with `model: smollm2-135m-instruct` sends
`max_tokens`, not `llm.max_tokens`, and asks for the task `chat`. `model_view(plan, "llm")` is the plan
of that model alone as the server's handlers read it: its tasks and params under their own names
(what requests name), its nodes, walks and streams under the plan's (what the conductor runs and
its events carry). `Plan.include_of(node)` is the include a node belongs to, whose prefix a request's
params lose on their way to that node's executor.
"""
from __future__ import annotations

from typing import Callable

import msgspec

from mstar_compiler.plan import IncludedModel, Plan, Track


def included(plan: Plan, name: str) -> IncludedModel:
    """The include `name` of `plan` (KeyError naming the plan's includes)."""
    found = next((m for m in plan.models if m.name == name), None)
    if found is None:
        raise KeyError(f"plan {plan.model} includes no model '{name}' (it includes: "
                       f"{', '.join(m.name for m in plan.models) or 'none'})")
    return found


def model_view(plan: Plan, name: str) -> Plan:
    """The plan of include `name` alone: its tasks, default task, params and task streams named as its
    own graph names them; its nodes, walks, edges, streams, transfers and capture regions as the plan
    names them; the ranks it runs on."""
    model = included(plan, name)
    prefix = name + "."

    def own(text: str) -> bool:
        return text.startswith(prefix)

    def bare(text: str) -> str:
        return text[len(prefix):] if own(text) else text

    nodes = [msgspec.structs.replace(n, param_args={a: bare(p) for a, p in n.param_args.items()})
             for n in plan.nodes if own(n.name)]
    names = {n.name for n in nodes}
    tasks = [msgspec.structs.replace(t, name=bare(t.name), tracks=[_track(tr, bare) for tr in t.tracks])
             for t in plan.tasks if own(t.name)]
    return msgspec.structs.replace(
        plan, model=model.model, source=model.source, preset=model.preset, placement=model.placement,
        ranks=[msgspec.structs.replace(r, nodes=[n for n in r.nodes if n in names]) for r in plan.ranks],
        params=[msgspec.structs.replace(p, name=bare(p.name)) for p in plan.params if own(p.name)],
        nodes=nodes, edges=[e for e in plan.edges if e.src_node in names],
        request_inputs=[i for i in plan.request_inputs if i.node in names],
        walks=[w for w in plan.walks if own(w.name)], tasks=tasks, default_task=bare(model.default_task),
        transfers=[t for t in plan.transfers if t.src_node in names or t.dst_node in names],
        streams=[s for s in plan.streams if s.dst_node in names],
        capture_regions=[c for c in plan.capture_regions if own(c.walk)],
        task_streams=[msgspec.structs.replace(ts, name=bare(ts.name), task=bare(ts.task))
                      for ts in plan.task_streams if own(ts.task)],
        models=[msgspec.structs.replace(m, name=bare(m.name), default_task=bare(m.default_task))
                for m in plan.models if own(m.name)],
        cascades=[msgspec.structs.replace(c, name=bare(c.name), stages=[
            msgspec.structs.replace(s, task=bare(s.task)) for s in c.stages]) for c in plan.cascades if own(c.name)])


def own_view(plan: Plan) -> Plan:
    """The plan as its own model's clients see it: what the graph that includes the others declares itself
    (its nodes, params, tasks, cascades), none of theirs; a composed graph without tasks serves none here."""
    def mine(name: str) -> bool:
        return not plan.include_of(name)

    tasks = [t for t in plan.tasks if mine(t.name)]
    default = plan.default_task if any(t.name == plan.default_task for t in tasks) else tasks[0].name if tasks else ""
    nodes = {n.name for n in plan.nodes if mine(n.name)}
    return msgspec.structs.replace(
        plan, params=[p for p in plan.params if mine(p.name)], nodes=[n for n in plan.nodes if n.name in nodes],
        request_inputs=[i for i in plan.request_inputs if i.node in nodes],
        walks=[w for w in plan.walks if mine(w.name)], streams=[s for s in plan.streams if s.dst_node in nodes],
        tasks=tasks, default_task=default, task_streams=[ts for ts in plan.task_streams if mine(ts.task)],
        cascades=[c for c in plan.cascades if mine(c.name)])


def _track(track: Track, bare: Callable[[str], str]) -> Track:
    states = [msgspec.structs.replace(s, transitions=[
        msgspec.structs.replace(x, cond=msgspec.structs.replace(x.cond, param=bare(x.cond.param)))
        for x in s.transitions]) for s in track.states]
    return msgspec.structs.replace(track, states=states)
