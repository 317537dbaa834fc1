"""Strict input: an unknown query parameter or body field is a 400 naming it, never silently ignored.

``?limit=abc`` or ``?stauts=ready`` used to answer as if nothing had been asked, which hides a client's bug
behind plausible data. A view lists what it reads: its FilterSet's parameters, its paginator's, and any
extra names; everything else is refused before the view runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

from rest_framework import serializers
from rest_framework.request import Request

from .errors import ValidationFailed

__all__ = ["StrictQueryMixin", "StrictInput", "JSONString", "JSONBoolean", "JSONInteger", "JSONNumber",
           "reject_unknown_params",
           "validate_idempotency_key", "free_json_validate", "FREE_JSON_MAX_DEPTH", "no_final_newline"]



def reject_unknown_params(request: Request, allowed: Iterable[str]) -> None:
    unknown = sorted(set(request.query_params) - set(allowed))
    if unknown:
        listed = ", ".join(sorted(set(allowed))) or "none"
        raise ValidationFailed(f"unknown query parameters: {', '.join(unknown)} (this endpoint takes: {listed})")


class StrictQueryMixin:
    """For DRF views: checks ``request.query_params`` against what the view declares, per method."""

    extra_query_params: tuple[str, ...] = ()

    def allowed_query_params(self, request: Request) -> set[str]:
        allowed = set(self.extra_query_params)
        if request.method in ("GET", "HEAD"):
            filterset_class = getattr(self, "filterset_class", None)
            if filterset_class is not None:
                allowed |= set(filterset_class.base_filters)
            paginator_class = getattr(self, "pagination_class", None)
            if paginator_class is not None:
                allowed |= set(getattr(paginator_class, "query_params", ()))
        return allowed

    def initial(self, request: Request, *args, **kwargs):
        super().initial(request, *args, **kwargs)  # type: ignore[misc]
        reject_unknown_params(request, self.allowed_query_params(request))


class StrictInput(serializers.Serializer):
    """Refuses bodies that are not objects and fields it does not declare (``{"is_admin": true}`` is a 400)."""

    # JSON Schema keywords the service's rules across fields come to (``anyOf``, ``if``/``then``), merged into the
    # body's schema (``controlplane.openapi.StrictInputSchema``) so the schema refuses what the server refuses,
    # instead of a 400 for a body the schema called valid. (A comment: the docstring is every body's description.)
    schema_rules: ClassVar[dict[str, Any]] = {}

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, dict):
            raise ValidationFailed("the body must be a JSON object")
        unknown = sorted(set(data) - set(self.fields))
        if unknown:
            raise ValidationFailed(f"unknown fields: {', '.join(unknown)}")
        return super().to_internal_value(data)


def no_final_newline(value: str) -> None:
    """Beside a ``RegexValidator`` whose pattern ends in ``$``: Python's ``$`` also matches before a final newline,
    the schema's (ECMA) pattern does not, so ``"a\n"`` would pass the validator and then be refused (or stored) as
    something the schema never allowed."""
    if value.endswith("\n"):
        raise serializers.ValidationError("must not end with a newline")


class JSONString(serializers.CharField):
    """A JSON string only: DRF's CharField turns ``1`` or ``true`` into ``"1"`` / ``"True"`` silently."""

    default_error_messages = {"not_a_string": "must be a JSON string"}

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, str):
            self.fail("not_a_string")
        return super().to_internal_value(data)


class JSONBoolean(serializers.BooleanField):
    """``true`` or ``false`` only: DRF's BooleanField also takes ``0``, ``"yes"`` and ``"on"`` (schemathesis
    found ``"one_time": 0`` accepted although the schema says boolean)."""

    default_error_messages = {"not_a_boolean": "must be true or false"}

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, bool):
            self.fail("not_a_boolean")
        return data


class JSONInteger(serializers.IntegerField):
    """A JSON integer only: DRF's IntegerField also takes ``"900"`` and ``true`` (a black-box run found a customer
    token's ``ttl_s: "900"`` and a rollout's ``wave_size: "5"`` accepted although the schema says integer). An
    integral number such as ``900.0`` stays accepted: JSON Schema counts it as an integer, so the schema allows it."""

    default_error_messages = {"not_an_integer": "must be a JSON integer"}

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, bool) or not (isinstance(data, int) or (isinstance(data, float) and data.is_integer())):
            self.fail("not_an_integer")
        return super().to_internal_value(data)


class JSONNumber(serializers.FloatField):
    """A JSON number only: DRF's FloatField also takes ``"30"`` and ``true``."""

    default_error_messages = {"not_a_number": "must be a JSON number"}

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            self.fail("not_a_number")
        return super().to_internal_value(data)


def validate_idempotency_key(idempotency_key: str | None) -> str | None:
    """1-200 characters without control characters (``openapi.IDEMPOTENCY_KEY_SCHEMA`` says the same)."""
    if idempotency_key is None:
        return None
    if not (1 <= len(idempotency_key) <= 200) or any(ord(c) < 32 or ord(c) == 127 for c in idempotency_key):
        raise ValidationFailed("Idempotency-Key must be 1-200 printable characters")
    return idempotency_key


# How deep a free JSON object (task params, a decision's result, MCP tool overrides) may nest below its top
# level. The schema states it (``controlplane.openapi``: one component per level, because client generators such
# as openapi-python-client refuse a recursive union), so the server refuses exactly what the schema does not allow.
FREE_JSON_MAX_DEPTH = 16


def free_json_validate(value: object, name: str) -> None:
    """A 400 naming the field for a NUL (``\\u0000``) in any key or string of a free JSON object, or for nesting
    deeper than ``FREE_JSON_MAX_DEPTH`` containers below it.

    JSON allows a NUL; PostgreSQL's ``jsonb`` (the inbox, the instance's task table) does not, so it used to be a
    500 at the insert (schemathesis found it in task params). Refusing it up front loses nothing silently. The
    depth bound is the schema's (and keeps a hostile body from nesting without end)."""
    nul = f"{name} must not contain NUL characters (\\u0000)"
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                raise ValidationFailed(nul, extra={"field": name})
            continue
        if not isinstance(item, dict | list):
            continue
        if depth >= FREE_JSON_MAX_DEPTH:  # a container at the schema's last level, which holds scalars only
            raise ValidationFailed(f"{name} nests deeper than {FREE_JSON_MAX_DEPTH} levels", extra={"field": name})
        if isinstance(item, dict):
            for key, inner in item.items():
                if "\x00" in str(key):
                    raise ValidationFailed(nul, extra={"field": name})
                stack.append((inner, depth + 1))
        else:
            stack.extend((inner, depth + 1) for inner in item)
