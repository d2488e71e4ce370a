"""JSON-schema output (issue 18): json_schema= converts through llama.cpp's converter into the
sampler's grammar; what comes out parses and validates (checked with the jsonschema package, which
no one here wrote), speculation stays lossless under it, and every misuse is a typed error."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from llamaspec_fixtures import FixtureInfo

import llamaspec
from llamaspec import InvalidOptionError, Speculative

from .conftest import token_ids

NAME = {"type": "string", "minLength": 1, "maxLength": 24}

# (what the user asks for, the schema): nested objects, arrays with bounds, enums, patterns, $ref,
# anyOf, required and optional properties, numbers with ranges, formats.
SCHEMAS: list[tuple[str, dict[str, Any]]] = [
    ("a person", {"type": "object", "properties": {"name": NAME, "age": {"type": "integer"}},
                  "required": ["name", "age"], "additionalProperties": False}),
    ("a yes or no", {"type": "boolean"}),
    ("a colour", {"enum": ["red", "green", "blue"]}),
    ("the answer", {"const": 42}),
    ("a temperature in Celsius", {"type": "integer", "minimum": -50, "maximum": 60}),
    ("a length in metres", {"type": "number"}),
    ("a dice roll", {"type": "integer", "minimum": 1, "maximum": 6}),
    ("a list of three fruits", {"type": "array", "items": NAME, "minItems": 3, "maxItems": 3}),
    ("up to two tags", {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 2}),
    ("a US zip code", {"type": "string", "pattern": "^[0-9]{5}$"}),
    ("a date", {"type": "string", "format": "date"}),
    ("a product code", {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2,4}$"}),
    ("a book", {"type": "object",
                "properties": {"title": NAME,
                               "author": {"type": "object", "properties": {"first": NAME, "last": NAME},
                                          "required": ["first", "last"], "additionalProperties": False},
                               "year": {"type": "integer", "minimum": 1450, "maximum": 2030}},
                "required": ["title", "author", "year"], "additionalProperties": False}),
    ("a labelled point", {"type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}, NAME]}),
    ("a shape", {"anyOf": [
        {"type": "object", "properties": {"circle": {"type": "integer", "minimum": 0}},
         "required": ["circle"], "additionalProperties": False},
        {"type": "object", "properties": {"square": {"type": "integer", "minimum": 0}},
         "required": ["square"], "additionalProperties": False}]}),
    ("a team", {"$defs": {"member": {"type": "object", "properties": {"name": NAME},
                                     "required": ["name"], "additionalProperties": False}},
                "type": "object",
                "properties": {"lead": {"$ref": "#/$defs/member"},
                               "others": {"type": "array", "items": {"$ref": "#/$defs/member"},
                                          "maxItems": 2}},
                "required": ["lead", "others"], "additionalProperties": False}),
    ("a setting", {"type": "object", "properties": {"key": NAME, "value": {"type": ["integer", "boolean"]}},
                   "required": ["key", "value"], "additionalProperties": False}),
    ("a user with an optional email", {"type": "object",
                                       "properties": {"name": NAME,
                                                      "email": {"type": "string", "maxLength": 30}},
                                       "required": ["name"], "additionalProperties": False}),
    ("a nullable score", {"type": ["number", "null"]}),
    ("a short word", {"type": "string", "minLength": 2, "maxLength": 8}),
    ("a status", {"type": "object", "properties": {"ok": {"type": "boolean"},
                                                   "code": {"enum": [200, 404, 500]}},
                  "required": ["ok", "code"], "additionalProperties": False}),
    ("an RGB colour", {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 255},
                       "minItems": 3, "maxItems": 3}),
    ("a price", {"type": "object", "properties": {"amount": {"type": "integer", "exclusiveMinimum": 0},
                                                  "currency": {"enum": ["EUR", "USD"]}},
                 "required": ["amount", "currency"], "additionalProperties": False}),
    ("a uuid", {"type": "string", "format": "uuid"}),
    ("a matrix", {"type": "array", "maxItems": 2,
                  "items": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}}),
]


def ask(what: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": "You answer with JSON only."},
            {"role": "user", "content": f"Give me {what}."}]


@pytest.mark.real_model
def test_output_parses_and_validates(smol: llamaspec.Model) -> None:
    """SmolLM2 under each schema, greedy: the text is JSON, valid against the schema, and the call
    ended because the grammar was complete (not at max_tokens)."""
    assert len(SCHEMAS) >= 20
    with llamaspec.Generator(smol, n_ctx=1024, n_threads=2) as gen:
        for what, schema in SCHEMAS:
            text = gen.generate(messages=ask(what), max_tokens=200, temperature=0, json_schema=schema)
            st = gen.last_stats
            assert st is not None and st.finish_reason == "stop", (what, text)
            value = json.loads(text)
            jsonschema.validate(value, schema)


@pytest.mark.real_model
def test_speculation_is_lossless_under_a_schema(smol: llamaspec.Model, smol_path: str) -> None:
    """The grammar constrains the target's sampler: a draft model (the same weights) and an n-gram
    drafter give plain decoding's tokens, greedy and seeded."""
    schema = SCHEMAS[11][1]
    cases: list[dict[str, Any]] = [{"temperature": 0}, {"temperature": 0.8, "seed": 5}]
    with llamaspec.Generator(smol, n_ctx=1024, n_threads=2) as plain:
        want = [token_ids(plain.stream_events(messages=ask("a book"), max_tokens=120, json_schema=schema,
                                              **c)) for c in cases]
    drafters: list[tuple[str, dict[str, Any]]] = [("draft", {"draft_model": smol_path}), ("ngram-simple", {})]
    for method, kw in drafters:
        with Speculative(smol, method=method, n_draft=4, n_ctx=1024, n_threads=2, **kw) as spec:
            for c, w in zip(cases, want):
                got = token_ids(spec.stream_events(messages=ask("a book"), max_tokens=120,
                                                   json_schema=schema, **c))
                assert got == w, (method, c)
            if method == "draft":
                assert spec.stats().drafts_accepted > 0


def test_mtp_is_lossless_under_a_schema(fx: llamaspec.Model) -> None:
    """The MTP fixture (its head drafts the next-next byte of a cycle the grammar mostly forbids):
    MTP's tokens equal plain decoding's, and at least some drafts are rejected by the grammar."""
    schema = {"type": "object", "properties": {"k": {"type": "string"}, "n": {"type": "integer"}},
              "required": ["k", "n"]}
    prompt = list(b"abc")
    with llamaspec.Generator(fx, n_ctx=256, n_threads=1) as plain:
        want = token_ids(plain.stream_events(prompt, 48, temperature=0, json_schema=schema))
    with llamaspec.MTP(fx, n_draft=3, n_ctx=256, n_threads=1) as spec:
        got = token_ids(spec.stream_events(prompt, 48, temperature=0, json_schema=schema))
        st = spec.stats()
    assert got == want
    assert st.drafts_generated > 0


def test_the_converter_is_llama_cpps(fx_info: FixtureInfo) -> None:
    """The public converter gives the grammar llama.cpp's converter gives (its known output for a
    small schema), and that grammar through grammar= is the same call as json_schema=."""
    g = llamaspec.json_schema_to_grammar({"enum": ["a", "b"]})
    assert g.startswith("root ::=") and '"\\"a\\""' in g and '"\\"b\\""' in g
    # property names are data, not keywords: a property called "not" is fine
    assert llamaspec.json_schema_to_grammar({"type": "object", "properties": {"not": {"type": "integer"}}})
    with llamaspec.Model(fx_info.path) as m, llamaspec.Generator(m, n_ctx=128, n_threads=1) as gen:
        a = token_ids(gen.stream_events(list(b"x"), 8, temperature=0, grammar=g))
        b = token_ids(gen.stream_events(list(b"x"), 8, temperature=0, json_schema={"enum": ["a", "b"]}))
    assert a == b and bytes(a[:3]) in (b'"a"', b'"b"')


@pytest.mark.parametrize("schema, message", [
    ({"type": "hiccup"}, "hiccup"),
    ({"type": 123}, "json_schema"),
    ({"$ref": "#/$defs/missing"}, "missing"),
    ({"type": "string", "pattern": "^(?<name>a)$"}, "not supported"),  # a regex with no grammar equivalent
    ({"type": "string", "pattern": "^(a$"}, "pattern"),  # not a regex
    ({"type": "integer", "minimum": float("nan")}, "JSON-serializable"),
    ({"x": object()}, "JSON-serializable"),
    # constraints the converter would drop without a word
    ({"type": "number", "minimum": 0}, "range on a number at #"),
    ({"type": "object", "properties": {"p": {"type": ["number", "null"], "maximum": 1}}},
     "at #/properties/p"),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "'uniqueItems' at #"),
    ({"anyOf": [{"type": "integer", "multipleOf": 3}]}, "'multipleOf' at #/anyOf/0"),
    ({"$defs": {"d": {"not": {"type": "null"}}}, "$ref": "#/$defs/d"}, "'not' at #/\\$defs/d"),
])
def test_bad_schemas_are_invalid_option_errors(fx: llamaspec.Model, schema: dict[str, Any],
                                                message: str) -> None:
    with pytest.raises(InvalidOptionError, match=message):
        llamaspec.json_schema_to_grammar(schema)
    with llamaspec.Generator(fx, n_ctx=64, n_threads=1) as gen:
        with pytest.raises(InvalidOptionError, match=message):
            gen.generate(list(b"x"), 4, json_schema=schema)
        assert gen.generate(list(b"x"), 2, temperature=0)  # still usable


def test_misuse_is_an_invalid_option_error(fx: llamaspec.Model) -> None:
    with llamaspec.Generator(fx, n_ctx=64, n_threads=1) as gen:
        with pytest.raises(InvalidOptionError, match="must be a dict"):
            gen.generate(list(b"x"), 4, json_schema="{}")
        with pytest.raises(InvalidOptionError, match="not both"):
            gen.generate(list(b"x"), 4, json_schema={"type": "integer"}, grammar='root ::= "1"')
        with pytest.raises(InvalidOptionError, match="not both"):
            gen.generate(list(b"x"), 4, json_schema={"type": "integer"}, grammar_root="num")
        # the session is still usable after each
        assert gen.generate(list(b"x"), 3, temperature=0, json_schema={"const": 7}) == "7"
    with pytest.raises(InvalidOptionError, match="must be a dict"):
        llamaspec.json_schema_to_grammar([1, 2])  # type: ignore[arg-type]

