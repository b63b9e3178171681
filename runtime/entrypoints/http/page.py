"""GET /: the page that shows the walk graph live and a playground; GET /v1/graph: what it draws.

The page is static files shipped in the package (runtime/entrypoints/http/static/: hand-written
HTML, CSS and JS, no build step, nothing fetched from elsewhere). Its shell holds no data:
the graph (`/v1/graph`), the live state (`/v1/state/stream`) and every playground request
go through `/v1/`, so with `--api-key` the page shows nothing until the key is entered.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp import web

from mstar_compiler.graph_layout import layout
from runtime.entrypoints.http.context import ServerContext
from runtime.entrypoints.http.families import families_of

STATIC = Path(__file__).parent / "static"
_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".png": "image/png"}


def playground(server: ServerContext) -> dict[str, Any]:
    """Which playground panels the plan can serve, with what the page needs to fill them in."""
    tasks = {t.name for t in server.plan.tasks}
    speech = server.speech_model
    panels: dict[str, Any] = {
        "chat": server.chat_node is not None and "chat" in tasks, "images": None, "rollout": None,
        "speech": None if speech is None else {"voices": list(speech.speaker.voices), "sample_rate": speech.sample_rate},
    }
    for family in families_of(server.plan):     # BAGEL's image panel, V-JEPA's rollout panel
        if family.playground is not None:
            panels.update(family.playground(server.plan))
    return panels


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "index.html", headers={"Content-Type": "text/html", "Cache-Control": "no-cache"})


async def static_file(request: web.Request) -> web.FileResponse:
    """Only the files shipped in static/, by plain name (no paths)."""
    name = request.match_info["name"]
    path = STATIC / name
    if "/" in name or name.startswith(".") or path.suffix not in _TYPES or not path.is_file():
        raise web.HTTPNotFound(text=f"no static file {name!r}")
    return web.FileResponse(path, headers={"Content-Type": _TYPES[path.suffix], "Cache-Control": "no-cache"})


async def graph(request: web.Request) -> web.Response:
    server: ServerContext = request.app["mstar"]
    return web.json_response({**layout(server.plan), "model_id": server.model_id, "playground": playground(server)})


def install_page(app: web.Application) -> None:
    app.router.add_get("/", index)
    app.router.add_get("/static/{name}", static_file)
    app.router.add_get("/v1/graph", graph)
