"""The published schema has no reference cycle, and its free JSON says exactly what the server accepts.

Issue 37: openapi-python-client skipped every operation whose body used the recursive ``NulFreeJSON`` union (task
and schedule creation, a schedule's change, an effect's decision: 4 operations with openapi-python-client 0.29.1).
A schema without a cycle is what client generators need; the free JSON is now one component per level, and the
server refuses the same depth (``controlplane.strict.free_json_validate``)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from drf_spectacular.generators import SchemaGenerator

from controlplane.errors import ValidationFailed
from controlplane.openapi import NUL_FREE_OBJECT
from controlplane.strict import FREE_JSON_MAX_DEPTH, free_json_validate


@pytest.fixture(scope="module")
def schema(django_db_setup, django_db_blocker) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    with django_db_blocker.unblock():  # a few fields read their choices from the database
        return SchemaGenerator().get_schema(request=None, public=True)  # type: ignore[no-any-return]


def _refs(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"].rsplit("/", 1)[-1]} if isinstance(node.get("$ref"), str) else set()
        return found.union(*(_refs(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_refs(v) for v in node))
    return set()


def test_no_component_reaches_itself_through_its_references(schema: dict[str, Any]) -> None:
    components = schema["components"]["schemas"]
    edges = {name: _refs(body) for name, body in components.items()}
    state: dict[str, str] = {}

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == "done":
            return
        assert state.get(name) != "open", f"reference cycle: {' -> '.join([*path, name])}"
        state[name] = "open"
        for target in sorted(edges.get(name, ())):
            visit(target, [*path, name])
        state[name] = "done"

    for name in sorted(edges):
        visit(name, [])
    assert "NulFreeJSON" in components and f"NulFreeJSON{FREE_JSON_MAX_DEPTH}" in components


def _nested(depth: int) -> dict[str, Any]:
    """A free object whose deepest container sits ``depth`` levels below it."""
    value: Any = "leaf"
    for level in range(depth):
        value = {"k": value} if level % 2 else [value]
    return {"top": value}


def _schema_accepts(schema: dict[str, Any], value: object) -> bool:
    resolver_root = {"components": schema["components"], **NUL_FREE_OBJECT}
    try:
        jsonschema.Draft202012Validator(resolver_root).validate(value)
    except jsonschema.ValidationError:
        return False
    return True


@pytest.mark.parametrize("depth", [0, 1, FREE_JSON_MAX_DEPTH - 1, FREE_JSON_MAX_DEPTH, FREE_JSON_MAX_DEPTH + 3])
def test_the_schema_and_the_server_agree_on_how_deep_free_json_nests(schema: dict[str, Any], depth: int) -> None:
    value = _nested(depth)
    try:
        free_json_validate(value, "params")
        server = True
    except ValidationFailed as refused:
        server = False
        assert "params" in str(refused)
    assert server == _schema_accepts(schema, value), (depth, server)
    assert server == (depth < FREE_JSON_MAX_DEPTH), depth


def test_a_nul_anywhere_is_refused_by_both(schema: dict[str, Any]) -> None:
    for value in ({"a": "x\x00"}, {"a": [{"b\x00": 1}]}, {"a": [[["\x00"]]]}):
        with pytest.raises(ValidationFailed, match="NUL"):
            free_json_validate(value, "params")
        assert not _schema_accepts(schema, value), json.dumps(value)
