"""A release's configuration schema: merged from its agents' schemas, checked, and used to validate values.

No database and no I/O here. Each agent of a release may declare an object schema (``Agent(config_schema=...)``);
the release has one configuration, so their properties are merged into one object schema: the same property
declared differently by two agents refuses the upload (400 naming it and both kinds); ``required`` is the union,
and if any agent sets ``additionalProperties: false`` the merged schema allows only the properties some agent
declares. Values are validated with
``jsonschema`` (Draft 2020-12) and the first error is reported with its path (``default_config.limits.max``), as
RFC 7807 problem+json through ``ValidationFailed``.

A property marked ``"format": "credential"`` holds the NAME of a credential in the tenant's vault, never a value
(``CREDENTIAL_FORMAT``): ``credential_fields`` lists them, so the services can check that each named credential
exists for the tenant.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, best_match

from controlplane.errors import ValidationFailed

__all__ = ["CONFIG_EFFECTS_KEY", "CONFIG_MCP_KEY", "CREDENTIAL_FORMAT", "MAX_SCHEMA_BYTES", "config_validate",
           "credential_fields", "schema_merge"]

CREDENTIAL_FORMAT = "credential"
# Reserved top-level key: the customer's effect providers, checked by the runtime's rules (releases.effects_config),
# not by the agents' schema, so a closed schema does not refuse it.
CONFIG_EFFECTS_KEY = "effects"
# Reserved top-level key: the customer's MCP servers (issue 34), checked by the runtime's rules too.
CONFIG_MCP_KEY = "mcp"
MAX_SCHEMA_BYTES = 65_536
# Top-level keywords an agent's object schema may use: anything else (allOf, if/then, $defs, ...) cannot be merged
# with another agent's without changing its meaning, so it is refused rather than silently dropped.
_TOP_LEVEL = {"$schema", "title", "description", "type", "properties", "required", "additionalProperties"}


def _path(parts: Iterable[Any], root: str) -> str:
    out = root
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def schema_merge(schemas: Mapping[str, Any]) -> dict[str, Any] | None:
    """One object schema from each kind's (``{kind: schema}``); None when no kind declares one."""
    if not schemas:
        return None
    properties: dict[str, Any] = {}
    owner: dict[str, str] = {}
    required: set[str] = set()
    closed = False
    for kind in sorted(schemas):
        schema = schemas[kind]
        if not isinstance(schema, Mapping) or schema.get("type", "object") != "object":
            raise ValidationFailed(f"the config_schema of agent kind {kind!r} must be an object schema "
                                   "(\"type\": \"object\")")
        unknown = sorted(set(schema) - _TOP_LEVEL)
        if unknown:
            raise ValidationFailed(f"the config_schema of agent kind {kind!r} uses {', '.join(unknown)} at its top "
                                   f"level; a release's schemas are merged by property, so only "
                                   f"{', '.join(sorted(_TOP_LEVEL))} may appear there")
        try:
            Draft202012Validator.check_schema(dict(schema))
        except SchemaError as exc:
            raise ValidationFailed(f"the config_schema of agent kind {kind!r} is not a valid JSON Schema at "
                                   f"{_path(exc.absolute_path, 'config_schema')}: {exc.message}"[:500]) from None
        for name, definition in dict(schema.get("properties", {})).items():
            if name in properties and properties[name] != definition:
                raise ValidationFailed(f"agent kinds {owner[name]!r} and {kind!r} define the configuration "
                                       f"property {name!r} differently; a release has one configuration, so they "
                                       "must agree (or use different names)", extra={"field": name})
            properties.setdefault(name, definition)
            owner.setdefault(name, kind)
        required.update(schema.get("required", []))
        # One agent refusing unknown keys closes the release's configuration to keys no agent declares: a typo in
        # an override is then a 400, not a value nobody reads.
        closed = closed or schema.get("additionalProperties", True) is False
    merged: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        merged["required"] = sorted(required)
    if closed:
        merged["additionalProperties"] = False
    if len(json.dumps(merged)) > MAX_SCHEMA_BYTES:
        raise ValidationFailed(f"the release's config_schema must be at most {MAX_SCHEMA_BYTES} bytes of JSON")
    return merged


def config_validate(schema: Mapping[str, Any] | None, config: Mapping[str, Any], *, root: str) -> None:
    """400 naming the first offending field (``root.a.b``) unless ``config`` satisfies ``schema``.

    No schema: any JSON object. The message names the field and the rule it broke; a credential field's value is
    a name, not a secret, so echoing it is safe.
    """
    if schema is None:
        return
    config = {key: value for key, value in config.items() if key not in (CONFIG_EFFECTS_KEY, CONFIG_MCP_KEY)}
    error = best_match(Draft202012Validator(dict(schema)).iter_errors(config))
    if error is None:
        return
    parts = list(error.absolute_path)
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [r for r in error.validator_value if r not in error.instance]
        parts += missing[:1]
    elif error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = set((error.schema.get("properties") or {}) if isinstance(error.schema, dict) else ())
        extra = sorted(k for k in error.instance if k not in known)
        parts += extra[:1]
    field = _path(parts, root)
    raise ValidationFailed(f"{field}: {error.message}"[:500], extra={"field": field})


def credential_fields(schema: Mapping[str, Any] | None) -> list[str]:
    """The top-level properties that hold credential names (``"format": "credential"``)."""
    if schema is None:
        return []
    return sorted(name for name, definition in dict(schema.get("properties", {})).items()
                  if isinstance(definition, Mapping) and definition.get("format") == CREDENTIAL_FORMAT)
