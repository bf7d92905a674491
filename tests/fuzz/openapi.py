"""Hypothesis strategies for HTTP request bodies from an OpenAPI document (FastAPI's
`app.openapi()`, served at /openapi.json): bodies that follow the schema, and bodies broken
on purpose (a field of the wrong type, a number far out of range, an unknown field, a
required field missing, a deeply nested value, not an object at all).

Covers the JSON Schema that pydantic emits for the gateway's request models: $ref, anyOf,
const/enum, objects (properties, required, additionalProperties), arrays, strings, integers
and numbers with bounds, booleans, null, and `{}` (any value).
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import strategies as st

Strategy = st.SearchStrategy[Any]
Schema = dict[str, Any]

# Values that are wrong for most fields, or right type but absurd.
WILD: list[Any] = [
    None,
    True,
    "",
    "x" * 5000,
    "\u0000\ud7ff\ufffd",
    -1,
    0,
    2**31,
    2**63,
    -(2**63) - 1,
    2**64,
    10**30,
    -(10**30),
    1e308,
    -1e308,
    5e-324,
    0.5,
    [],
    [[]],
    {},
    {"a": {"b": {"c": []}}},
    [1, "two", None, 3.5],
]


def json_values(max_leaves: int = 10) -> Strategy:
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=20),
    )
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=max_leaves,
    )


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


class OpenApi:
    def __init__(self, document: dict[str, Any]) -> None:
        self._document = document

    def body_schema(self, path: str) -> Schema:
        content = self._document["paths"][path]["post"]["requestBody"]["content"]
        return self.resolve(content["application/json"]["schema"])

    def resolve(self, schema: Schema) -> Schema:
        while "$ref" in schema:
            name = schema["$ref"].rsplit("/", 1)[-1]
            schema = self._document["components"]["schemas"][name]
        return schema

    def valid(self, schema: Schema, depth: int = 0) -> Strategy:
        """Values that follow `schema` (pydantic may still refuse what JSON Schema cannot say)."""
        schema = self.resolve(schema)
        if "const" in schema:
            return st.just(schema["const"])
        if "enum" in schema:
            return st.sampled_from(schema["enum"])
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return st.one_of([self.valid(branch, depth + 1) for branch in schema[key]])
        kind = schema.get("type")
        if isinstance(kind, list):
            return st.one_of([self.valid({**schema, "type": k}, depth + 1) for k in kind])
        if kind == "object":
            return self._object(schema, depth)
        if kind == "array":
            items = self.valid(schema.get("items", {}), depth + 1)
            low = schema.get("minItems", 0)
            high = min(schema.get("maxItems", low + 6), low + 6)
            return st.lists(items, min_size=low, max_size=high)
        if kind == "string":
            low, high = schema.get("minLength", 0), min(schema.get("maxLength", 40), 200)
            # Now and then lone surrogates too: JSON can carry them (an escaped U+D800), UTF-8 cannot.
            return st.one_of(
                st.text(min_size=low, max_size=high),
                st.text(st.characters(exclude_categories=[]), min_size=low, max_size=high),
            )
        if kind == "integer":
            return _integers(schema)
        if kind == "number":
            return _numbers(schema)
        if kind == "boolean":
            return st.booleans()
        if kind == "null":
            return st.none()
        return json_values(4 if depth else 10)

    def _object(self, schema: Schema, depth: int) -> Strategy:
        properties: dict[str, Schema] = schema.get("properties", {})
        required = set(schema.get("required", []))
        extra = schema.get("additionalProperties", True)
        fixed = {name: self.valid(properties[name], depth + 1) for name in properties if name in required}
        optional = {
            name: self.valid(properties[name], depth + 1) for name in properties if name not in required
        }
        strategy = st.fixed_dictionaries(fixed, optional=optional)
        if isinstance(extra, dict):
            more = st.dictionaries(st.text(max_size=10), self.valid(extra, depth + 1), max_size=4)
            strategy = st.tuples(strategy, more).map(lambda pair: {**pair[1], **pair[0]})
        return strategy

    def broken(self, schema: Schema) -> Strategy:
        """A valid body with one thing wrong, or no object at all."""
        schema = self.resolve(schema)
        names = sorted(schema.get("properties", {}))
        required = sorted(schema.get("required", []))

        @st.composite
        def build(draw: st.DrawFn) -> Any:
            body = dict(draw(self.valid(schema)))
            how = draw(
                st.sampled_from(
                    ["wild field", "wild field", "unknown field", "missing field", "nested", "not an object"]
                )
            )
            if how == "wild field" and names:
                body[draw(st.sampled_from(names))] = draw(st.one_of(st.sampled_from(WILD), json_values()))
            elif how == "unknown field":
                body[draw(st.text(min_size=1, max_size=12).filter(lambda k: k not in names))] = draw(
                    json_values()
                )
            elif how == "missing field" and required:
                body.pop(draw(st.sampled_from(required)), None)
            elif how == "nested" and names:
                body[draw(st.sampled_from(names))] = nested(draw(st.integers(10, 200)))
            elif how == "not an object":
                return draw(st.one_of(st.sampled_from(WILD), json_values()))
            return body

        return build()


def _integers(schema: Schema) -> Strategy:
    low = schema.get("minimum")
    high = schema.get("maximum")
    if "exclusiveMinimum" in schema:
        low = math.floor(schema["exclusiveMinimum"]) + 1
    if "exclusiveMaximum" in schema:
        high = math.ceil(schema["exclusiveMaximum"]) - 1
    low = None if low is None else math.ceil(low)
    high = None if high is None else math.floor(high)
    if low is not None and high is not None and low > high:
        return st.nothing()
    parts = [st.integers(low, high)]
    edges = [v for v in (low, high) if v is not None]
    if edges:
        parts.append(st.sampled_from(edges))
    small_low = -5 if low is None else max(low, -5)
    small_high = 64 if high is None else min(high, 64)
    if small_low <= small_high:  # small values: the ones that get past validation to work
        parts.append(st.integers(small_low, small_high))
    return st.one_of(parts)


def _numbers(schema: Schema) -> Strategy:
    return st.floats(
        min_value=schema.get("minimum", schema.get("exclusiveMinimum")),
        max_value=schema.get("maximum", schema.get("exclusiveMaximum")),
        exclude_min="exclusiveMinimum" in schema,
        exclude_max="exclusiveMaximum" in schema,
        allow_nan=False,
        allow_infinity=False,
    )
