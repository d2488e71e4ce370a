"""`llamaspec serve`: an OpenAI-compatible HTTP server on one llamaspec session (ADR 0016).

Needs the ``server`` extra (``pip install 'llamaspec[server]'``); the core library never imports
this package.
"""

from __future__ import annotations

from .app import create_app
from .config import ServerConfig, add_serve_arguments, config_from_args

__all__ = ["ServerConfig", "add_serve_arguments", "config_from_args", "create_app"]
