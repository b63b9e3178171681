"""The runtime chunk policy of a compiled plan's streaming edge (`mstar_compiler.plan.Stream`)."""
from __future__ import annotations

from mstar_compiler.plan import Stream
from runtime.streams.chunk_policy import ChunkPolicy, policy_from_spec


def plan_policy(stream: Stream) -> ChunkPolicy:
    """Fixed / Sliding / LeftContext from the plan's `ChunkPolicy` record."""
    p = stream.policy
    if p.kind == "fixed":
        return policy_from_spec({"fixed": p.size})
    if p.kind == "sliding":
        return policy_from_spec({"sliding": {"window": p.size, "stride": p.stride}})
    return policy_from_spec({"left_context": {"chunk": p.size, "context": p.context}})
