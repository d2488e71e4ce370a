"""Routes llama.cpp's log into Python's logging (logger ``llamaspec.llama_cpp``).

The native side drops lines below a threshold before touching the GIL; ``sync_log_level`` keeps that
threshold in step with the logger's effective level and is called whenever a model, context or
generation starts. ``common``'s own console logger is silenced natively (docs/adr/0005-logging.md).
"""

from __future__ import annotations

import atexit
import logging

from . import _native

LOGGER_NAME = "llamaspec.llama_cpp"
logger = logging.getLogger(LOGGER_NAME)
logging.getLogger("llamaspec").addHandler(logging.NullHandler())

_TO_PY = {
    _native.LOG_LEVEL_DEBUG: logging.DEBUG,
    _native.LOG_LEVEL_INFO: logging.INFO,
    _native.LOG_LEVEL_WARN: logging.WARNING,
    _native.LOG_LEVEL_ERROR: logging.ERROR,
}


def _forward(level: int, message: str) -> None:
    logger.log(_TO_PY.get(level, logging.INFO), message)


def sync_log_level() -> None:
    """Let through, natively, only the llama.cpp lines the logger would emit."""
    eff = logger.getEffectiveLevel()
    if eff <= logging.DEBUG:
        native = _native.LOG_LEVEL_DEBUG
    elif eff <= logging.INFO:
        native = _native.LOG_LEVEL_INFO
    elif eff <= logging.WARNING:
        native = _native.LOG_LEVEL_WARN
    else:
        native = _native.LOG_LEVEL_ERROR
    _native.set_log_level(native)


_native.set_log_callback(_forward)
atexit.register(_native.set_log_callback, None)  # no calls into Python while the interpreter exits
sync_log_level()
