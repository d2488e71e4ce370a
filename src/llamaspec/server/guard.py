"""The server's front door, as plain ASGI middleware (cheaper than Starlette's BaseHTTPMiddleware, and
it leaves streamed responses alone): CORS, the API key, and the body size limit (ADR 0016)."""

from __future__ import annotations

import hmac

from starlette.datastructures import Headers
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .protocol import ApiError
from .webui import is_public

MAX_BODY = 8 * 1024 * 1024
PUBLIC_PATHS = frozenset({"/health", "/v1/health"})
LOCAL_ORIGIN_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]"})


def origin_host(origin: str) -> str:
    """The host of an Origin header ("http://[::1]:3000" -> "[::1]")."""
    rest = origin.split("://", 1)[-1]
    if rest.startswith("["):
        return rest[: rest.find("]") + 1]
    return rest.split(":", 1)[0].split("/", 1)[0]


def error_response(e: ApiError) -> JSONResponse:
    """The JSON error response of e (503 says when to retry)."""
    headers = {"Retry-After": "1"} if e.status == 503 else None
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


class Guard:
    """Checks every HTTP request before the app sees it and adds the CORS headers to its response.

    - CORS: with ``cors_origins``, those origins (``*``: any); otherwise, with an API key, any origin
      (every route but /health needs the key, as with llama-server); without a key, only localhost
      origins, so that a web page a user opens cannot drive a local server.
    - API key: ``Authorization: Bearer KEY`` or ``X-Api-Key: KEY``, compared in constant time; not
      asked of /health, nor (with ``webui``) of the chat page and its assets, which ask for it.
    - Bodies over MAX_BODY: 413 from the Content-Length (the app also counts what it reads).
    """

    def __init__(self, app: ASGIApp, keys: tuple[str, ...] = (), cors_origins: tuple[str, ...] = (),
                 webui: bool = False) -> None:
        self.app = app
        self.webui = webui  # the page and its assets are public: the page asks for the key
        self.keys = [k.encode() for k in keys]
        self.cors_origins = cors_origins

    def cors_headers(self, origin: str | None) -> list[tuple[bytes, bytes]]:
        if not origin:
            return []
        if self.cors_origins:
            allowed = origin in self.cors_origins or "*" in self.cors_origins
        else:
            allowed = bool(self.keys) or origin_host(origin) in LOCAL_ORIGIN_HOSTS
        if not allowed:
            return []
        # raw headers keep their case (some clients compare names case-sensitively)
        return [
            (b"Access-Control-Allow-Origin", origin.encode("latin-1")),
            (b"Access-Control-Allow-Credentials", b"true"),
            (b"Access-Control-Allow-Methods", b"GET, POST, DELETE, OPTIONS"),
            (b"Access-Control-Allow-Headers", b"*"),
            (b"Vary", b"Origin"),
        ]

    def refuse(self, scope: Scope, headers: Headers) -> ApiError | None:
        public = scope["path"] in PUBLIC_PATHS or (self.webui and is_public(scope["path"]))
        if self.keys and not public:
            given = headers.get("authorization", "")
            token = given[7:].strip() if given[:7].lower() == "bearer " else headers.get("x-api-key", "")
            if not any(hmac.compare_digest(token.encode(), k) for k in self.keys):
                return ApiError(401, "Invalid API Key")
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY):
            return ApiError(413, f"the request body is over {MAX_BODY} bytes")
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        cors = self.cors_headers(headers.get("origin"))

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start" and cors:
                message = {**message, "headers": [*message.get("headers", []), *cors]}
            await send(message)

        if scope["method"] == "OPTIONS":  # a preflight
            status = 403 if headers.get("origin") and not cors else 200
            await Response(status_code=status)(scope, receive, send_with_cors)
            return
        refused = self.refuse(scope, headers)
        if refused is not None:
            await error_response(refused)(scope, receive, send_with_cors)
            return
        await self.app(scope, receive, send_with_cors)
