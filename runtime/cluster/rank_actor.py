"""One rank's worker inside a Ray actor: the normal `mstar-run worker` entry, run in the actor's process.

The actor is handed the plan's bytes and the rank's CURVE key file's text (Ray's object
transport carries them once, to start it; no tensor ever goes through Ray), writes them to a
private 0700 directory on its node and runs `mstar-run worker` with them, advertising its
node's IP (`ray.util.get_node_ip_address()`) so ranks on other nodes reach its inbox. `run`
returns the worker's exit status once the conductor shuts it down; until then the actor is
the worker, so its death is the rank's.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from runtime.conductor.workers import RankLaunch


class RankActor:
    """Made into a Ray actor class by the launcher (`ray.remote(RankActor)`)."""

    def where(self) -> dict[str, Any]:
        """The node this actor landed on, as Ray names it, and the worker's pid."""
        import ray
        return {"node_ip": ray.util.get_node_ip_address(), "node_id": ray.get_runtime_context().get_node_id(),
                "pid": os.getpid()}

    def run(self, launch: RankLaunch, plan: bytes, key_json: str | None) -> int:
        """Serve the rank until the conductor says Shutdown (blocks; the actor runs one worker)."""
        import ray

        from runtime.cli import main
        directory = tempfile.mkdtemp(prefix=f"mstar-rank-{launch.rank}-")   # 0700
        try:
            plan_path = os.path.join(directory, "plan.bin")
            with open(plan_path, "wb") as f:
                f.write(plan)
            key_path = None
            if key_json is not None:
                key_path = os.path.join(directory, "key.json")
                fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(key_json)
            return main(["worker", *launch.argv(plan_path, key_path, ray.util.get_node_ip_address())])
        finally:
            shutil.rmtree(directory, ignore_errors=True)
