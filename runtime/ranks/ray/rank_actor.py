"""One rank's worker inside a Ray actor: `mstar-run worker`'s entry (runtime/worker/cli.py), run in the actor's process.

Ray's channels are plaintext (unless the cluster runs TLS), so no secret goes through them:
`keygen` makes the rank's CURVE key pair here, writes it 0600 into a private 0700 directory
on this node and hands back only the public half, which the conductor admits. `run` is then
handed the plan's bytes and the worker's flags (the conductor's address and public key among
them; Ray's object transport carries them once, to start it; no tensor ever goes through Ray),
and runs `mstar-run worker` with them, advertising its node's IP
(`ray.util.get_node_ip_address()`) so ranks on other nodes reach its inbox. `run` returns the
worker's exit status once the conductor shuts it down; until then the actor is the worker, so
its death is the rank's.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from runtime.ranks.workers import RankLaunch
from runtime.transport.keys import ClusterKeys


class RankActor:
    """Made into a Ray actor class by the launcher (`ray.remote(RankActor)`). Calls: keygen, where, run."""

    def __init__(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="mstar-rank-")   # 0700: this rank's key file and plan copy
        self.key_path: str | None = None

    def keygen(self, rank: int, server_key: str) -> bytes:
        """Make the rank's key pair here and keep it in a 0600 file; return its public half (z85)."""
        keys = ClusterKeys.for_rank(rank, server_key.encode())
        self.key_path = os.path.join(self.directory, "key.json")
        keys.write(self.key_path)
        return keys.public

    def where(self) -> dict[str, Any]:
        """The node this actor landed on, as Ray names it, and the worker's pid."""
        import ray
        return {"node_ip": ray.util.get_node_ip_address(), "node_id": ray.get_runtime_context().get_node_id(),
                "pid": os.getpid()}

    def run(self, launch: RankLaunch, plan: bytes) -> int:
        """Serve the rank until the conductor says Shutdown (blocks; the actor runs one worker)."""
        import ray

        from runtime.worker.cli import worker_main
        try:
            plan_path = os.path.join(self.directory, "plan.bin")
            with open(plan_path, "wb") as f:
                f.write(plan)
            return worker_main(launch.argv(plan_path, self.key_path, ray.util.get_node_ip_address()))
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)
