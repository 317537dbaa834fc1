"""Audit rows for people: who acted by name, and what the row records as ``key: value`` pairs, not dict text."""

from __future__ import annotations

from typing import Any

from django import template

register = template.Library()

_KINDS = {"user": "", "token": "API ", "instance": "instance ", "system": ""}


@register.filter
def audit_actor(row: Any) -> str:
    """``system: system`` becomes "System (manage.py instance start)" or "System"; a user is their name."""
    kind, label = str(getattr(row, "actor_kind", "")), str(getattr(row, "actor_label", "") or "")
    if kind == "system":
        return "System" if label in ("", "system") else f"System ({label})"
    return f"{_KINDS.get(kind, kind + ' ')}{label}".strip() or kind


def _value(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return ", ".join(_value(v) for v in value) or "none"
    if value is None or value == "":
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


@register.filter
def audit_data(data: Any) -> str:
    """``{'kind': 'demo', 'task': '1a2b'}`` becomes "kind: demo · task: 1a2b"."""
    if not data:
        return ""
    if not isinstance(data, dict):
        return _value(data)
    return " · ".join(f"{key.replace('_', ' ')}: {_value(value)}" for key, value in data.items())
