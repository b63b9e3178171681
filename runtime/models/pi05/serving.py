"""What π0.5 adds to the server (runtime/entrypoints/http/families.py): `POST /v1/actions`
(runtime/models/pi05/actions_api.py)."""
from __future__ import annotations

from aiohttp import web

from runtime.entrypoints.http.families import FamilyServing
from runtime.models.pi05.actions_api import actions


def _install(app: web.Application) -> None:
    app.router.add_post("/v1/actions", actions)


SERVING = FamilyServing(frozenset({"pi05_prefix"}), install=_install)
