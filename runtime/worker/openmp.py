"""OpenMP settings of a worker process, applied before torch loads (libgomp reads them once).

torch's CPU wheel runs its intra-op threads on GNU OpenMP, whose idle threads spin for a
long while (libgomp's default spin count) before they sleep. Where other processes take
cores, a spinning thread is descheduled while the other threads of its parallel region
wait for it, so every region of a decode step can wait out a scheduler time slice: on 2
shared cores at load 8, SmolLM2 decoded 16 streams at 11.8 tok/s with spinning threads and
89 tok/s with sleeping ones (`python tools/bench.py threads`, README). Sleeping at once
costs a wake-up per region, which is small next to a time slice.
"""
from __future__ import annotations

import logging
import sys
from typing import MutableMapping

log = logging.getLogger(__name__)


def passive_waits(environ: MutableMapping[str, str]) -> bool:
    """Make idle OpenMP threads sleep at once unless the user chose a wait policy (OMP_WAIT_POLICY
    or GOMP_SPINCOUNT); True if this set it. Only works before torch is imported."""
    if "torch" in sys.modules:
        log.warning("torch was imported before the worker's OpenMP settings: idle threads keep spinning "
                    "(set OMP_WAIT_POLICY=PASSIVE in the environment instead)")
        return False
    if "OMP_WAIT_POLICY" in environ or "GOMP_SPINCOUNT" in environ:
        return False
    environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return True
