"""llamaspec: GGUF language models in-process on llama.cpp, fast with speculative decoding.

The public API is what this module exports; ``llamaspec._native`` is private.
"""

from __future__ import annotations

from . import _native
from . import _log  # noqa: F401  (installs the llama.cpp -> logging bridge)
from .context import Context
from .errors import (
    BackendError,
    BusyError,
    ChatTemplateError,
    ClosedError,
    ContextOverflowError,
    DecodeError,
    DraftModelRequiredError,
    GenerationTimeout,
    GrammarError,
    IncompatibleVocabError,
    InvalidOptionError,
    LlamaspecError,
    LoadCancelledError,
    ModelLoadError,
    UnsupportedModelError,
)
from .chat import ChatParser, ChatPrompt
from .events import (
    ChatMessage,
    ContentDelta,
    Done,
    EndOfGeneration,
    Event,
    GenerationStats,
    PromptProgress,
    ReasoningDelta,
    Stats,
    Token,
    ToolCall,
    ToolCallArguments,
    ToolCallStart,
    TopLogprob,
)
from .generator import Generator
from .grammar import json_schema_to_grammar
from .model import Model
from .ngram import ngram_cache_create
from .speculative import DEFAULT_N_DRAFT_MAX, METHODS, MTP, Speculative
from .stats import PromptCacheInfo, PromptCacheRamInfo, SpecStats, StageStats

__version__ = "0.1.0"

__all__ = [
    "Model",
    "Context",
    "Generator",
    "Speculative",
    "MTP",
    "METHODS",
    "DEFAULT_N_DRAFT_MAX",
    "PromptCacheInfo",
    "PromptCacheRamInfo",
    "SpecStats",
    "StageStats",
    "ngram_cache_create",
    "json_schema_to_grammar",
    "Token",
    "TopLogprob",
    "EndOfGeneration",
    "Done",
    "Stats",
    "PromptProgress",
    "Event",
    "GenerationStats",
    "ChatPrompt",
    "ChatParser",
    "ChatMessage",
    "ToolCall",
    "ContentDelta",
    "ReasoningDelta",
    "ToolCallStart",
    "ToolCallArguments",
    "LlamaspecError",
    "ModelLoadError",
    "LoadCancelledError",
    "BackendError",
    "UnsupportedModelError",
    "ContextOverflowError",
    "BusyError",
    "GenerationTimeout",
    "InvalidOptionError",
    "GrammarError",
    "ChatTemplateError",
    "DecodeError",
    "ClosedError",
    "IncompatibleVocabError",
    "DraftModelRequiredError",
    "system_info",
    "backends",
]


def system_info() -> str:
    """llama.cpp's summary of the compiled CPU features and backends (e.g. "AVX2 = 1 | ...")."""
    return _native.system_info()


def backends() -> list[tuple[str, list[tuple[str, str, str]]]]:
    """The compute backends this build has: (ggml registry name, its devices as (name, description,
    kind)), kind one of "cpu", "gpu", "igpu" (integrated), "accel"; e.g.
    ``[("CPU", [("CPU", "AMD EPYC", "cpu")])]``. A GPU build adds e.g. ("CUDA", [...]) with a device
    per GPU it finds (none on a machine without one); an RPC build adds ("RPC", [])."""
    return [(name, list(devices)) for name, devices in _native.backends()]
