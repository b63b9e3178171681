"""Does the Ray cluster refuse a caller without its token? `--ray` serves only on one that does.

Anyone who reaches an unauthenticated Ray cluster can run code in it, and so in every rank's
actor. Our own connection says nothing: a client holding a token connects to a cluster that
checks none just as well. So the cluster is asked as a stranger would: a short subprocess with
RAY_AUTH_MODE=disabled and no token (the auth mode is process-wide in Ray, hence a process of
its own) opens a GCS client on the cluster's GCS address. Its first call (GetClusterId) is
answered either with an AuthenticationError (the GCS checks tokens: good) or with the id
(anyone gets in). Every other Ray component is reached through the GCS, and a node only joins
a GCS that checks tokens by sending the token itself.

    python -m runtime.ranks.ray.token_auth HOST:PORT     # exit 0: refused, 3: let in, 1: no answer
"""
from __future__ import annotations

import os
import subprocess
import sys

from runtime.ranks.ray import ClusterError

ENFORCED, OPEN = 0, 3           # the probe's exit codes
PROBE_TIMEOUT_S = 30.0          # Ray's import takes a second; its GCS client gives up on a silent address later
HOW_TO = ("make a token with `ray get-auth-token --generate` and start every node, and this server, with "
          "RAY_AUTH_MODE=token and that token (in ~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN); "
          "or pass --ray-allow-unauthenticated on a network you trust")


def requires_token(gcs_address: str) -> bool:
    """Whether the cluster at `gcs_address` refuses a caller without a token; ClusterError if it
    cannot be told (the probe got no answer)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")}
    try:
        done = subprocess.run([sys.executable, "-P", "-m", "runtime.ranks.ray.token_auth", gcs_address],
                              env={**env, "RAY_AUTH_MODE": "disabled"}, capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        done = None
    if done is None or done.returncode not in (ENFORCED, OPEN):
        why = "no answer" if done is None else (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ClusterError(f"--ray {gcs_address}: cannot tell whether the cluster checks tokens ({why})")
    return done.returncode == ENFORCED


def _probe(gcs_address: str) -> int:
    """In the probe's process (no token, auth disabled): ENFORCED when the GCS refuses us, OPEN when it answers."""
    from ray._raylet import GcsClient
    from ray.exceptions import AuthenticationError
    try:
        GcsClient(address=gcs_address)       # asks the GCS for the cluster id right away
    except AuthenticationError:
        return ENFORCED
    return OPEN


if __name__ == "__main__":
    sys.exit(_probe(sys.argv[1]))
