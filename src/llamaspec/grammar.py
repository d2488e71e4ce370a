"""Structured output: a JSON schema as the grammar a generation call samples under.

``json_schema=`` (a sampling option of every call) is converted here, by llama.cpp's own converter
(common's json-schema-to-grammar), into the GBNF grammar that ``grammar=`` takes. The grammar
constrains the target's sampler only, so speculation stays lossless: a draft token the grammar
forbids is simply rejected at verification.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from . import _native
from .errors import InvalidOptionError


#: Constraints llama.cpp's converter reads past without enforcing them: refused, so that the output
#: never breaks a rule of the schema that was given (``format`` stays an annotation, as in JSON Schema).
_NOT_ENFORCED = (
    "multipleOf", "uniqueItems", "contains", "minContains", "maxContains", "minProperties",
    "maxProperties", "patternProperties", "propertyNames", "dependentRequired", "dependentSchemas",
    "dependencies", "if", "then", "else", "not", "unevaluatedProperties", "unevaluatedItems",
)
_RANGES = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def _check_enforceable(node: Any, path: str) -> None:
    """Walk the subschemas (not the data-like parts such as property names or enum values) and raise
    InvalidOptionError at the first constraint the converter would drop."""
    if not isinstance(node, Mapping):
        return
    for key in _NOT_ENFORCED:
        if key in node:
            raise InvalidOptionError(f"json_schema is not supported: {key!r} at {path} cannot be enforced")
    types = node.get("type")
    types = types if isinstance(types, list) else [types]
    if "number" in types and any(k in node for k in _RANGES):
        raise InvalidOptionError(f"json_schema is not supported: a range on a number at {path} cannot be "
                                 "enforced (integer ranges can: use \"type\": \"integer\")")
    for key in ("properties", "$defs", "definitions"):
        sub = node.get(key)
        if isinstance(sub, Mapping):
            for name, value in sub.items():
                _check_enforceable(value, f"{path}/{key}/{name}")
    for key in ("items", "additionalProperties"):
        _check_enforceable(node.get(key), f"{path}/{key}")
    for key in ("prefixItems", "anyOf", "oneOf", "allOf", "items"):
        sub = node.get(key)
        if isinstance(sub, list):
            for i, value in enumerate(sub):
                _check_enforceable(value, f"{path}/{key}/{i}")


def json_schema_to_grammar(schema: Mapping[str, Any]) -> str:
    """The GBNF grammar that accepts exactly the JSON values ``schema`` describes.

    Supports what llama.cpp supports: types, nested objects (``properties``, ``required``,
    ``additionalProperties``), arrays with ``items`` / ``prefixItems`` and ``minItems`` /
    ``maxItems``, ``enum`` and ``const``, string ``pattern`` / ``format`` / length bounds, integer
    ranges, ``$ref`` to ``$defs`` / ``definitions``, ``anyOf`` / ``oneOf`` / ``allOf``.

    Args:
        schema: a JSON Schema, as a dict.

    Returns:
        The grammar text (root rule ``root``).

    Raises:
        InvalidOptionError: ``schema`` is not a dict, not JSON-serializable, not a valid schema, or
            uses a part the converter cannot enforce (the message names it and where): a regular
            expression with no grammar equivalent, a range on a non-integer number, or a keyword
            such as ``uniqueItems``, ``multipleOf``, ``not`` or ``if``.
    """
    if not isinstance(schema, Mapping):
        raise InvalidOptionError(f"json_schema must be a dict, not {type(schema).__name__}")
    try:
        text = json.dumps(schema, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise InvalidOptionError(f"json_schema is not JSON-serializable: {e}") from None
    grammar = _native.json_schema_to_grammar(text)  # invalid schemas first: their message is llama.cpp's
    _check_enforceable(schema, "#")
    return grammar
