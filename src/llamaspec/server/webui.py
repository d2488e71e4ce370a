"""The chat page at ``GET /`` (ADR 0032): three static files shipped in the package (webui/), served as
they are; no build step, nothing fetched from elsewhere. The page talks to the server's own API
(/props, /v1/chat/completions with ``return_token_origin``, /slots, /metrics) like any client, so it
needs nothing the API does not already offer.

The page and its assets are public even with an API key (the page asks for the key, as llama-server's
does); every API route behind it still checks the key. A Content-Security-Policy allows scripts,
styles and connections from this server only, so a model's answer that holds markup can run
nothing even if it ever reached the document as HTML (the page writes model text as text).
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI
from fastapi.responses import Response

from .protocol import ApiError

ASSET_PREFIX = "/webui/"
ASSETS = {  # the only files served, and their types
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


def is_public(path: str) -> bool:
    """Whether a path is the page or one of its assets (public even with an API key)."""
    return path == "/" or (path.startswith(ASSET_PREFIX) and path[len(ASSET_PREFIX):] in ASSETS)


def _asset(name: str) -> Response:
    body = files(__package__).joinpath("webui", name).read_bytes()
    return Response(
        body,
        media_type=ASSETS[name],
        headers={
            "Content-Security-Policy": CSP,
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
            "Cache-Control": "no-cache",  # revalidated: a new llamaspec's page is never mixed with an old one
        },
    )


def add_webui(app: FastAPI) -> None:
    """Serve the page at / and its assets under /webui/."""

    @app.get("/", include_in_schema=False)
    async def page() -> Response:
        return _asset("index.html")

    @app.get(ASSET_PREFIX + "{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        if name not in ASSETS:
            raise ApiError(404, "File Not Found")
        return _asset(name)
