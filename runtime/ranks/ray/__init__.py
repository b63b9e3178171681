"""Ranks placed by a cluster manager instead of started as subprocesses of the server.

`mstar-run plan.bin --ray [ADDRESS]`: `RayLauncher` (ray_launcher.py) connects to a running
Ray cluster, reserves one placement-group bundle per rank with what the plan implies
(`bundles.py`) and starts each rank's normal `mstar-run worker` inside a Ray actor
(`rank_actor.py`). Ray only starts and watches the actors; the control plane stays ZeroMQ
(CURVE) and collectives stay torch.distributed. Ray is the optional extra `mstar[cluster]`.
"""
from __future__ import annotations


class ClusterError(RuntimeError):
    """The cluster cannot serve the plan (no Ray, no cluster, not enough resources); said to the user."""
