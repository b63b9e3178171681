"""`mstar-run plan.bin --ray [ADDRESS]`: the plan's ranks as Ray actors on a running Ray cluster.

    launcher = RayLauncher(RayOptions("auto"), plan, "plan.bin")   # connects, reserves a bundle per rank
    ConductorConfig(endpoint=launcher.conductor_endpoint(...), launcher=launcher)

Each rank gets one bundle (bundles.py: its CPUs, a GPU when the cluster has any, host memory
for its weights) in a placement group: one STRICT_PACK group per tensor-parallel group, one
group of the other ranks placed by `--ray-strategy`. The conductor's WorkerSet calls `start`
for each rank and again when a rank died, and watches the returned `RayRank` as it watches a
subprocess: the actor's `run` call ends (with an error, when the actor died) and the rank is
dead; a replacement actor goes into the same bundle, so it lands where the plan needs it.
The conductor's endpoint must be reachable from every node: a loopback one becomes this node's
Ray IP. No secret goes through Ray (its channels are plaintext unless the cluster runs TLS): each
actor makes its rank's CURVE pair itself (`keygen`) and hands back the public half, which the
conductor admits; the actor gets the plan, the conductor's address and public key, and flags.
The cluster must refuse callers without its token (token_auth.py), unless the operator says
--ray-allow-unauthenticated, which is logged and shown in /health. A tensor-parallel rank that
comes back restarts its whole group, since the others are still in the old torch.distributed group.
"""
from __future__ import annotations

import concurrent.futures
import logging
import os
import socket
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mstar_compiler.plan import Plan
from runtime.ranks.ray import ClusterError
from runtime.ranks.ray.bundles import pack_groups, rank_resources
from runtime.ranks.ray.rank_actor import RankActor
from runtime.ranks.ray.token_auth import HOW_TO, requires_token
from runtime.ranks.workers import LaunchedRank, RankLaunch

log = logging.getLogger(__name__)
LOOPBACK = ("127.", "localhost", "[::1]")
PROBE_TIMEOUT_S = 5.0    # ray.init retries a silent address for good; a plain TCP connect says so in seconds


@dataclass(frozen=True)
class RayOptions:
    """The `--ray*` flags."""

    address: str = "auto"           # the cluster's head host:port; "auto": $RAY_ADDRESS or the one on this host
    cpus_per_rank: float = 1.0      # CPUs each rank's actor reserves (its torch threads)
    strategy: str = "PACK"          # placement of the ranks outside a tensor-parallel group
    placement_timeout_s: float = 120.0
    allow_unauthenticated: bool = False   # serve on a cluster without token authentication (warned, in /health)


@dataclass
class _Group:
    """One placement group (a tensor-parallel group is restarted whole by the conductor)."""

    ranks: tuple[int, ...]
    pg: Any                        # ray.util.placement_group.PlacementGroup
    strategy: str
    is_tensor_parallel: bool


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ClusterError("--ray needs Ray on this host and on every node of the cluster: "
                           "pip install 'mstar[cluster]' (ray==2.60.0)") from None
    return ray


def _probe(address: str) -> None:
    """A host:port address must answer a TCP connect (ray:// client addresses and "" are left to Ray)."""
    host, _, port = address.rpartition(":")
    if not host or "://" in address:
        return
    try:
        socket.create_connection((host, int(port)), PROBE_TIMEOUT_S).close()
    except (OSError, ValueError) as exc:
        raise ClusterError(f"--ray {address}: no Ray head answers there ({exc}); start one with `ray start --head` "
                           "or pass its host:port (`ray status` on the head prints it)") from None


def reachable_endpoint(endpoint: str, node_ip: str) -> str:
    """The conductor's endpoint as actors on every node reach it: a loopback host becomes `node_ip`."""
    scheme, _, hostport = endpoint.partition("://")
    host, _, port = hostport.rpartition(":")
    return f"{scheme}://{node_ip}:{port}" if host.startswith(LOOPBACK) else endpoint


class RayRank:
    """A rank's actor, watched as the WorkerSet watches a subprocess (poll / kill / wait)."""

    def __init__(self, ray: Any, rank: int, actor: Any, run_ref: Any, where_ref: Any, key_ref: Any) -> None:
        self.ray, self.rank, self.actor = ray, rank, actor
        self._run = run_ref.future()      # done when the worker returned or the actor died
        self._where = where_ref.future()
        self.public_key = key_ref.future()   # the public half of the pair the actor made (z85)
        self._said = False

    def poll(self) -> int | None:
        if not self._run.done():
            return None
        exc = self._run.exception()
        if exc is not None:
            if not self._said:
                self._said = True
                log.error("rank %d: its Ray actor ended: %s", self.rank, str(exc).strip().splitlines()[0])
            return 1
        return self._run.result() or 0

    def kill(self) -> None:
        self.ray.kill(self.actor, no_restart=True)

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            self._run.result(timeout)
        except concurrent.futures.TimeoutError:
            raise subprocess.TimeoutExpired(f"Ray actor of rank {self.rank}", timeout or 0) from None
        except Exception:   # the actor died: its status is the error poll() reports
            pass
        return self.poll()

    def where(self) -> dict[str, Any]:
        """The actor's node and pid once it answered; its state until then."""
        if not self._where.done():
            return {"state": "starting"}
        if self._where.exception() is not None:
            return {"state": "ended"}
        has_key = self.public_key.done() and self.public_key.exception() is None
        return {**self._where.result(), **({"public_key": self.public_key.result().decode()} if has_key else {})}


class RayLauncher:
    """Connects to the cluster, reserves the plan's bundles, starts one actor per rank."""

    def __init__(self, options: RayOptions, plan: Plan, plan_path: str) -> None:
        self.ray = _import_ray()
        self.options = options
        _probe(os.environ.get("RAY_ADDRESS", "") if options.address == "auto" else options.address)
        from ray.exceptions import AuthenticationError
        try:
            self.ray.init(address=options.address, namespace="mstar", logging_level=logging.WARNING)
        except AuthenticationError as exc:
            raise ClusterError(f"--ray {options.address}: the cluster refused this server's Ray token ({exc.message}); "
                               f"{HOW_TO}") from None
        except (ConnectionError, ValueError, RuntimeError) as exc:
            raise ClusterError(f"--ray {options.address}: cannot connect to a Ray cluster ({exc}); start one with "
                               "`ray start --head` or pass its head's host:port") from None
        self.has_token_auth = self._check_token_auth()
        self.node_ip = self.ray.util.get_node_ip_address()
        self.plan_bytes = Path(plan_path).read_bytes()
        has_gpus = self.ray.cluster_resources().get("GPU", 0) > 0
        self.resources = {r.rank: r for r in rank_resources(plan, options.cpus_per_rank, has_gpus)}
        self.groups = self._reserve(plan)
        self.actor_class = self.ray.remote(RankActor)
        self.ranks: dict[int, RayRank] = {}

    def _check_token_auth(self) -> bool:
        """Whether the cluster refuses callers without its token; if it does not, ClusterError unless the
        operator allowed it, and then one warning."""
        gcs = self.ray.get_runtime_context().gcs_address
        try:
            if requires_token(gcs):
                return True
        except ClusterError:
            self.ray.shutdown()
            raise
        if not self.options.allow_unauthenticated:
            self.ray.shutdown()
            raise ClusterError(f"--ray {self.options.address}: the Ray cluster at {gcs} runs without token "
                               f"authentication, so anyone who reaches it can run code in every rank: {HOW_TO}")
        log.warning("the Ray cluster at %s runs WITHOUT token authentication (--ray-allow-unauthenticated): anyone "
                    "who reaches it can run code in every rank", gcs)
        return False

    def _reserve(self, plan: Plan) -> dict[int, _Group]:
        """One placement group per pack group, all ready before any worker starts."""
        from ray.util.placement_group import placement_group
        groups = [_Group(g.ranks, placement_group([self.resources[r].bundle() for r in g.ranks], strategy=g.strategy,
                                                  name=f"mstar-{plan.model}-{i}"), g.strategy, g.is_tensor_parallel)
                  for i, g in enumerate(pack_groups(plan, self.options.strategy))]
        for group in groups:
            if not group.pg.wait(timeout_seconds=self.options.placement_timeout_s):
                self._release(groups)
                needs = [self.resources[r].bundle() for r in group.ranks]
                raise ClusterError(f"the Ray cluster cannot place ranks {list(group.ranks)} ({group.strategy}) within "
                                   f"{self.options.placement_timeout_s:.0f} s: they need {needs}, the cluster has "
                                   f"{self.ray.available_resources()} free; add nodes or lower --ray-cpus-per-rank")
        log.info("Ray placement groups ready: %s", ", ".join(f"{list(g.ranks)} {g.strategy}" for g in groups))
        return {r: g for g in groups for r in g.ranks}

    def conductor_endpoint(self, endpoint: str) -> str:
        """Where actors on every node reach the conductor: a loopback endpoint becomes this node's Ray IP."""
        return reachable_endpoint(endpoint, self.node_ip)

    def start(self, launch: RankLaunch) -> LaunchedRank:
        """A fresh actor for `launch.rank` in its bundle, making the rank's key pair and running its worker."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        group, res = self.groups[launch.rank], self.resources[launch.rank]
        actor = self.actor_class.options(
            num_cpus=res.num_cpus, num_gpus=res.num_gpus, memory=res.memory_bytes, max_restarts=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=group.pg, placement_group_bundle_index=group.ranks.index(launch.rank))).remote()
        # an actor runs its calls in order: the key file exists before run, and where answers before run blocks
        public_key = actor.keygen.remote(launch.rank, launch.server_key)
        where = actor.where.remote()
        launch = replace(launch, key_file=None, threads=max(1, int(res.num_cpus)))
        self.ranks[launch.rank] = rank = RayRank(self.ray, launch.rank, actor,
                                                 actor.run.remote(launch, self.plan_bytes), where, public_key)
        return LaunchedRank(rank, rank.public_key)

    def describe(self) -> dict[str, Any]:
        """Where each rank runs, for /v1/models."""
        ranks = {str(r): {**rank.where(), "bundle": self.resources[r].bundle(),
                          "placement_group": self.groups[r].pg.id.hex(), "strategy": self.groups[r].strategy}
                 for r, rank in sorted(self.ranks.items())}
        return {"manager": "ray", "node_ip": self.node_ip, "token_auth": self.has_token_auth, "ranks": ranks}

    def close(self) -> None:
        for rank in self.ranks.values():
            if rank.poll() is None:
                rank.kill()
        self._release(list({id(g): g for g in self.groups.values()}.values()))
        self.ray.shutdown()

    def _release(self, groups: list[_Group]) -> None:
        from ray.util.placement_group import remove_placement_group
        for group in groups:
            remove_placement_group(group.pg)

