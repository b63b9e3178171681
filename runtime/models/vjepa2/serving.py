"""What V-JEPA 2-AC adds to the server (runtime/entrypoints/http/families.py): `POST /v1/rollouts` and the
page's rollout panel."""
from __future__ import annotations

from typing import Any

from aiohttp import web

from mstar_compiler.plan import Plan
from runtime.models.vjepa2.rollouts_api import TASK, rollouts
from runtime.entrypoints.http.families import FamilyServing


def _install(app: web.Application) -> None:
    app.router.add_post("/v1/rollouts", rollouts)


def _playground(plan: Plan) -> dict[str, Any]:
    pred = next(n for n in plan.nodes if n.kind == "vjepa2_ac_predictor")
    if TASK not in {t.name for t in plan.tasks}:
        return {}
    return {"rollout": {key: int(pred.dims[key]) for key in ("image_size", "action_dim", "state_dim", "tubelet_size")}}


SERVING = FamilyServing(frozenset({"vjepa2_ac_predictor"}), install=_install, playground=_playground)
