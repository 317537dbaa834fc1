"""OpenAPI post-processing: every operation documents the problem+json errors it can answer with.

Views raise errors through ``controlplane.errors`` and DRF, and ``controlplane.problems`` renders
them all the same way; this hook writes that contract into the schema once, so clients (and the
schemathesis fuzz test) can rely on it. No I/O here.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiSerializerExtension

from .strict import FREE_JSON_MAX_DEPTH

__all__ = ["NUL_FREE_OBJECT", "StrictInputSchema", "add_problem_responses", "paginated", "PAGE_PARAMETERS",
           "IDEMPOTENCY_KEY_SCHEMA", "idempotency_key", "limit_parameter", "BODY_REQUIRED"]

PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "RFC 7807 problem details.",
    "properties": {
        "type": {"type": "string", "format": "uri-reference",
                 "description": "A link, relative to this API's host, to the page explaining the problem: "
                                "/problems/<type>"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "instance": {"type": "string"},
        "errors": {
            "type": "array",
            "items": {"type": "object", "properties": {"field": {"type": "string"}, "message": {"type": "string"}},
                      "required": ["field", "message"]},
        },
    },
    "required": ["type", "title", "status", "detail"],
}

_ALWAYS = {
    "400": "Invalid input (problem+json, with `errors` per field).",
    "401": "Missing, invalid or revoked operator token.",
    "403": "The token lacks the scope this request needs.",
    "406": "The `Accept` header asks for something other than JSON.",
    "429": "Throttled (see `Retry-After`) or the operator's tenant quota is reached.",
}
_BY_METHOD = {
    "post": {"409": "Conflict, e.g. the slug is taken.", "415": "The body is not JSON.",
             "422": "The `Idempotency-Key` was used with a different body."},
    "put": {"409": "Conflict, e.g. the tenant is being deprovisioned.", "415": "The body is not JSON."},
    "delete": {"409": "Conflict, e.g. the tenant is being deprovisioned."},
}
_RETRY_AFTER = {"Retry-After": {"schema": {"type": "integer"}, "description": "Seconds to wait (throttled)."}}


_NO_NUL = "^[^\\x00]*$"


def _nul_free_level(level: int) -> dict[str, Any]:
    """Level ``level`` of a free JSON value (1 = a value of the free object itself): a NUL-free string, a number,
    a boolean or null, and below the last level an array or object of the next level's values."""
    scalars: list[dict[str, Any]] = [{"type": "string", "pattern": _NO_NUL}, {"type": ["number", "boolean", "null"]}]
    if level == FREE_JSON_MAX_DEPTH:
        return {"description": f"A JSON scalar (level {level}, the deepest); no NUL in a string.", "anyOf": scalars}
    below = {"$ref": f"#/components/schemas/{_nul_free_name(level + 1)}"}
    return {"description": f"Any JSON value (level {level} of {FREE_JSON_MAX_DEPTH}); no NUL (\\u0000) in a key "
                           "or string.",
            "anyOf": [*scalars, {"type": "array", "items": below},
                      {"type": "object", "propertyNames": {"pattern": _NO_NUL}, "additionalProperties": below}]}


def _nul_free_name(level: int) -> str:
    return "NulFreeJSON" if level == 1 else f"NulFreeJSON{level}"


# Any JSON without a NUL in a key or string, nested at most FREE_JSON_MAX_DEPTH levels below a free object such as
# task params (``controlplane.strict.free_json_validate`` refuses the same): what PostgreSQL's jsonb stores. One
# component per level, not one recursive union: client generators (openapi-python-client 0.29 skipped every
# operation that used the recursive one) need a schema without a cycle; tests/controlplane/test_openapi_acyclic.py.
NUL_FREE_JSON: dict[str, dict[str, Any]] = {_nul_free_name(level): _nul_free_level(level)
                                            for level in range(1, FREE_JSON_MAX_DEPTH + 1)}
NUL_FREE_OBJECT: dict[str, Any] = {"type": "object", "propertyNames": {"pattern": _NO_NUL},
                                   "additionalProperties": {"$ref": "#/components/schemas/NulFreeJSON"}}


class StrictInputSchema(OpenApiSerializerExtension):
    """Every ``StrictInput``, nested ones included (a schedule's ``task``): the schema drf-spectacular maps, closed
    (an unknown field is a 400), plus the serializer's ``schema_rules``."""

    target_class = "controlplane.strict.StrictInput"
    match_subclasses = True

    def map_serializer(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        schema: dict[str, Any] = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        if direction != "request" or not schema.get("properties"):
            # A StrictInput shown in an answer (a schedule's task) describes it, and an empty body (``EmptyInput``)
            # is documented as none, as before.
            return schema
        return {**schema, "additionalProperties": False, **getattr(self.target, "schema_rules", {})}


BODY_REQUIRED = "x-body-required"


def add_problem_responses(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    result.setdefault("components", {}).setdefault("schemas", {})["Problem"] = PROBLEM_SCHEMA
    result["components"]["schemas"].update(NUL_FREE_JSON)
    problem = {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            wanted = dict(_ALWAYS)
            if "{" in path:
                wanted["404"] = "Not found, or another operator's: the two are indistinguishable."
            elif any(p.get("name") == "cursor" for p in operation.get("parameters", [])):
                wanted["404"] = "The `cursor` is not one this API gave out (no such page)."
            wanted.update(_BY_METHOD.get(method, {}))
            for code, description in wanted.items():
                entry: dict[str, Any] = {"description": description, "content": problem}
                if code == "429":
                    entry["headers"] = _RETRY_AFTER
                responses.setdefault(code, entry)
            for code, entry in responses.items():
                if code >= "400" and "content" not in entry:
                    # Declared by a view with a description only (its agent instance down, the tenant
                    # suspended): a problem like every other error; a 503 also says when to retry.
                    entry["content"] = problem
                    if code == "503":
                        entry["headers"] = _RETRY_AFTER
                elif code >= "400":
                    # Declared with a body of its own (the MCP endpoint's JSON-RPC error): the refusals made
                    # before the view runs (a NUL in the path, a throttle) are still problems.
                    entry["content"] = {**entry["content"], **problem}
            _no_nul_in_parameters(operation)
            # A view whose body is read raw (not through a serializer with required fields) says it must have
            # one with ``extensions={BODY_REQUIRED: True}``: drf-spectacular cannot tell, and without it an empty
            # body is schema-valid and its 400 a contradiction.
            if operation.pop(BODY_REQUIRED, False) and "requestBody" in operation:
                operation["requestBody"]["required"] = True
    _close_request_bodies(result)
    _nullable_as_type_lists(result)
    return result


def _nullable_as_type_lists(node: Any) -> None:
    """OpenAPI 3.1 has no ``nullable``: DRF's pagination schemas still write it (``next``/``previous``), so
    they become ``type: [string, "null"]`` as drf-spectacular writes its own fields in 3.1."""
    if isinstance(node, dict):
        if node.pop("nullable", False) and isinstance(node.get("type"), str):
            node["type"] = [node["type"], "null"]
        for value in node.values():
            _nullable_as_type_lists(value)
    elif isinstance(node, list):
        for value in node:
            _nullable_as_type_lists(value)


def _no_nul_in_parameters(operation: dict[str, Any]) -> None:
    """``controlplane.security`` refuses a NUL anywhere in the path, query or headers (400: PostgreSQL cannot
    hold one in text), so a free-text parameter says so; one with a format, an enum or a pattern excludes it."""
    for parameter in operation.get("parameters", []):
        schema = parameter.get("schema") or {}
        if (parameter.get("in") in ("query", "path", "header") and schema.get("type") == "string"
                and not {"pattern", "enum", "format"} & schema.keys()):
            schema["pattern"] = _NO_NUL


def _close_request_bodies(result: dict[str, Any]) -> None:
    """Every request body is strict (``controlplane.strict.StrictInput``: an unknown field is a 400), so the
    schema says ``additionalProperties: false``; clients and fuzzers then know ``{"is_admin": true}`` is wrong."""
    schemas = result.get("components", {}).get("schemas", {})
    bodies = {ref.rsplit("/", 1)[-1]
              for operations in result.get("paths", {}).values() for operation in operations.values()
              for media in (operation.get("requestBody") or {}).get("content", {}).values()
              if (ref := (media.get("schema") or {}).get("$ref"))}
    for name in bodies:
        schema = schemas.get(name)
        if schema is not None and schema.get("type") == "object":
            schema.setdefault("additionalProperties", False)
            for field in schema.get("properties", {}).values():
                _no_nul_in_strings(field)


def _no_nul_in_strings(schema: dict[str, Any]) -> None:
    """Serializers refuse NUL in every string (Django's ``ProhibitNullCharactersValidator``); say so wherever a
    string has no pattern, enum or format of its own (metadata values, list items included)."""
    if schema.get("type") == "string" and not {"pattern", "enum", "format"} & schema.keys():
        schema["pattern"] = _NO_NUL
    for inner in (schema.get("items"), schema.get("additionalProperties")):
        if isinstance(inner, dict):
            _no_nul_in_strings(inner)


def paginated(item: type) -> type:
    """The documented shape of a ``LimitOffsetPagination`` page of ``item`` (views paginate by hand)."""
    from rest_framework import serializers

    return type(f"Paginated{item.__name__.removesuffix('Output')}List", (serializers.Serializer,), {
        "count": serializers.IntegerField(),
        "next": serializers.URLField(allow_null=True),
        "previous": serializers.URLField(allow_null=True),
        "results": item(many=True),
    })


# What ``controlplane.strict.validate_idempotency_key`` accepts, so generated clients (and schemathesis) know.
IDEMPOTENCY_KEY_SCHEMA: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": 200,
                                          "pattern": "^[^\\x00-\\x1f\\x7f]+$"}


def idempotency_key(description: str = "Retries with the same key and body return the first answer and change "
                                       "nothing; the same key with another body is 422.") -> Any:
    from drf_spectacular.utils import OpenApiParameter

    return OpenApiParameter("Idempotency-Key", IDEMPOTENCY_KEY_SCHEMA, OpenApiParameter.HEADER, required=False,
                            description=description + " 1-200 characters, no control characters.")


def limit_parameter(maximum: int, default: int) -> Any:
    """``limit`` as every list takes it: a whole number from 1 to ``maximum`` (bounds in the schema, not prose)."""
    from drf_spectacular.utils import OpenApiParameter

    return OpenApiParameter("limit", {"type": "integer", "minimum": 1, "maximum": maximum}, required=False,
                            description=f"Page size, 1-{maximum} (default {default}).")


def _page_parameters() -> list[Any]:
    from drf_spectacular.utils import OpenApiParameter

    from .pagination import MAX_LIMIT

    return [
        limit_parameter(MAX_LIMIT, 50),
        OpenApiParameter("offset", {"type": "integer", "minimum": 0}, required=False, description="Items to skip."),
    ]


PAGE_PARAMETERS = _page_parameters()
