"""Registering an operator's agent release: checked, installed, probed, then recorded; never half of it.

A wheel (local profile) is kept in the control plane's object store under its digest (``releases/<hex>.whl``,
``releases.store``), where every machine of the control plane finds it, and installed once per digest into this
machine's cache (``RELEASES_ROOT/envs/<hex>/``; another machine installs it from the store when it needs it).
Every check runs before anything is recorded, and a failed upload leaves nothing behind: its scratch directory
is removed whatever happens, and the row is written last.

An image (Kubernetes profile) is only recorded: its reference checked (registry named, pinned by digest) and
its declared kinds; the registry holds the bytes and the pod runs them. Each profile refuses the other kind
(``ReleaseArtifactUnsupported``): its instances could never start it.
"""

from __future__ import annotations

import json
import re
import shutil
import uuid
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction

from controlplane.errors import Conflict, PayloadTooLarge, ReleaseArtifactUnsupported, ValidationFailed
from provisioning.choices import ReleaseArtifact
from provisioning.drivers.registry import runtime_release_artifact
from tenants.actors import Actor
from tenants.audit import audit_record
from tenants.audit_actions import AuditAction
from tenants.models import Operator

from .config_schema import config_validate, schema_merge
from .effects_config import effects_config_check
from .images import image_parse
from .models import AgentRelease
from .selectors import release_env_dir
from .store import release_wheel_store
from .validation import release_install_and_probe
from .wheels import missing_dependencies, sha256_digest, wheel_inspect

__all__ = ["release_create", "release_create_image", "release_env_dir", "MAX_NOTES_CHARS", "MAX_CONFIG_BYTES",
           "MAX_KINDS", "MAX_KIND_DESCRIPTION_CHARS", "KIND_PATTERN", "VERSION_PATTERN"]

MAX_NOTES_CHARS = 5_000
MAX_CONFIG_BYTES = 16_384
MAX_KINDS = 100
MAX_KIND_DESCRIPTION_CHARS = 1_000
# The runtime's rule for kind names (agent_runtime.sdk.agent._KIND), repeated: the control plane never imports
# agent code. tests/releases/test_release_images.py checks that both agree.
KIND_PATTERN = re.compile(r"^[a-z][a-z0-9_.-]{0,62}$")
# A provider name in Agent(connections=...), spelled as OAuth client providers are (a slug).
PROVIDER_PATTERN = re.compile(r"^[-a-zA-Z0-9_]{1,60}$")
# A host in Agent(egress=...): egress.rules.HOST_PATTERN, repeated (releases sits below egress; the runtime repeats
# it too, agent_runtime.sdk.agent.EGRESS_HOST_PATTERN; tests/provisioning/test_isolation_egress.py checks all three
# agree).
_HOST_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
EGRESS_HOST_PATTERN = rf"^(?:\*\.{_HOST_LABEL}(?:\.{_HOST_LABEL})+|{_HOST_LABEL}(?:\.{_HOST_LABEL})*)$"
MAX_EGRESS_HOST_CHARS = 253
MAX_EGRESS_HOSTS = 100
# An image's version is the operator's label (a wheel's comes from the wheel): what a tag may hold, plus "+".
VERSION_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,99}$")
# Why a release of this kind cannot be registered here, by the kind that was sent.
_REFUSAL: dict[str, str] = {
    ReleaseArtifact.WHEEL: "this control plane runs instances on Kubernetes: register a container image pinned by "
                           "digest (a JSON body with `image`, `version` and `kinds`), not a wheel",
    ReleaseArtifact.IMAGE: "this control plane runs instances as local processes: upload the agent as a wheel "
                           "(multipart, `file`), not a container image",
}


def _root() -> Path:
    return Path(settings.RELEASES_ROOT)


def _validate_config(default_config: object) -> dict[str, Any]:
    if not isinstance(default_config, dict):
        raise ValidationFailed("default_config must be a JSON object", extra={"field": "default_config"})
    if len(json.dumps(default_config)) > MAX_CONFIG_BYTES:
        raise ValidationFailed(f"default_config must be at most {MAX_CONFIG_BYTES} bytes of JSON",
                               extra={"field": "default_config"})
    effects_config_check(default_config, root="default_config")
    return default_config


def _require_artifact(artifact: str) -> None:
    if runtime_release_artifact() != artifact:
        raise ReleaseArtifactUnsupported(_REFUSAL[artifact], extra={"accepted": runtime_release_artifact()})


def _validate_notes(notes: object) -> str:
    if not isinstance(notes, str) or len(notes) > MAX_NOTES_CHARS or "\x00" in notes:
        raise ValidationFailed(f"notes must be at most {MAX_NOTES_CHARS} characters")
    return notes


def _version_is_new(operator: Operator, version: str) -> None:
    if AgentRelease.objects.filter(operator=operator, version=version).exists():
        raise Conflict(f"release {version} already exists; a version is registered once, bump it")


def release_create(*, operator: Operator, filename: str, data: bytes, actor: Actor, sha256: str | None = None,
                   notes: str = "", default_config: object = None) -> AgentRelease:
    """Validate and register a wheel as one of ``operator``'s releases (its version taken from the wheel)."""
    _require_artifact(ReleaseArtifact.WHEEL)
    if len(data) > settings.RELEASE_MAX_WHEEL_BYTES:
        raise PayloadTooLarge(f"the wheel is larger than {settings.RELEASE_MAX_WHEEL_BYTES} bytes",
                              extra={"max_bytes": settings.RELEASE_MAX_WHEEL_BYTES})
    _validate_notes(notes)
    config = _validate_config({} if default_config is None else default_config)
    info = wheel_inspect(Path(filename).name, data, expected_digest=sha256)
    _version_is_new(operator, info.version)
    missing = missing_dependencies(info.requires)
    if missing:
        raise ValidationFailed("the release needs what the runtime does not have: " + ", ".join(missing))
    digest = sha256_digest(data)
    scratch = _root() / f"tmp-{uuid.uuid4().hex}"
    scratch.mkdir(parents=True, mode=0o700)
    try:
        wheel = scratch / Path(filename).name
        wheel.write_bytes(data)
        probed = release_install_and_probe(wheel, scratch / "site")
        if (probed.distribution, probed.version) != (info.distribution, info.version):
            raise ValidationFailed(f"the wheel installed {probed.distribution} {probed.version}, not "
                                   f"{info.distribution} {info.version}")
        schema = schema_merge(probed.config_schemas)
        config_validate(schema, config, root="default_config")
        hosts = _validate_egress([h for declared in probed.egress.values() for h in declared])
        # Stored before the row: a row never names a wheel another machine cannot fetch. A refused row leaves
        # an object only these same bytes will ever use (content-addressed).
        key = release_wheel_store(digest=digest, data=data)
        env = release_env_dir(digest)
        if not env.exists():
            env.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            try:
                (scratch / "site").replace(env)
            except OSError:  # the same bytes installed concurrently (another upload): theirs is as good
                if not env.is_dir():
                    raise
        try:
            with transaction.atomic():
                release = AgentRelease.objects.create(
                    operator=operator, version=info.version, distribution=info.distribution, digest=digest,
                    filename=Path(filename).name, size_bytes=len(data),
                    artifact_key=key, kinds=probed.kinds, default_config=config,
                    config_schema=schema, connections=_validate_connections(
                        [p for declared in probed.connections.values() for p in declared]),
                    egress=hosts, notes=notes, created_by=actor.label)
                audit_record(actor=actor, action=AuditAction.RELEASE_CREATE, target=release, operator=operator, data={
                    "version": info.version, "digest": digest, "kinds": sorted(probed.kinds),
                    "isolation": probed.isolation, "config_schema": schema is not None,
                    "connections": release.connections, "egress": release.egress})
        except IntegrityError:  # the same version uploaded concurrently
            raise Conflict(f"release {info.version} already exists; a version is registered once, bump it") from None
        return release
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _validate_kinds(kinds: object) -> dict[str, str]:
    if not isinstance(kinds, dict) or not kinds:
        raise ValidationFailed("kinds must be a non-empty object: each agent kind the image provides -> its "
                               "description")
    if len(kinds) > MAX_KINDS:
        raise ValidationFailed(f"kinds may name at most {MAX_KINDS} agent kinds")
    for kind, description in kinds.items():
        if not isinstance(kind, str) or not KIND_PATTERN.match(kind):
            raise ValidationFailed(f"agent kind {str(kind)[:80]!r} must match {KIND_PATTERN.pattern} (lower case, "
                                   "digits, '_', '.', '-'), as the runtime requires")
        if not isinstance(description, str) or len(description) > MAX_KIND_DESCRIPTION_CHARS or "\x00" in description:
            raise ValidationFailed(f"the description of kind {kind!r} must be a string of at most "
                                   f"{MAX_KIND_DESCRIPTION_CHARS} characters")
    return dict(kinds)


def _validate_connections(connections: object) -> list[str]:
    """The providers a release's agents declare (``Agent(connections=...)``), sorted and unique."""
    if not isinstance(connections, list) or len(connections) > MAX_KINDS:
        raise ValidationFailed(f"connections must be a list of at most {MAX_KINDS} provider names")
    for provider in connections:
        if not isinstance(provider, str) or not PROVIDER_PATTERN.match(provider):
            raise ValidationFailed(f"connection provider {str(provider)[:80]!r} must match "
                                   f"{PROVIDER_PATTERN.pattern}, as OAuth client providers do")
    return sorted(set(connections))


def _validate_egress(hosts: object) -> list[str]:
    """The internet hosts a release's agents declare (``Agent(egress=...)``), lower case, sorted and unique. Checked
    here again (the probe's output is the release's own code speaking): a bad one is named in the 400."""
    if not isinstance(hosts, list) or len(hosts) > MAX_EGRESS_HOSTS:
        raise ValidationFailed(f"egress must be a list of at most {MAX_EGRESS_HOSTS} host names",
                               extra={"field": "egress"})
    for host in hosts:
        if (not isinstance(host, str) or len(host) > MAX_EGRESS_HOST_CHARS
                or not re.match(EGRESS_HOST_PATTERN, host)):
            raise ValidationFailed(f"egress host {str(host)[:80]!r} must be a host name (api.openai.com) or *.suffix "
                                   f"(*.example.com), at most {MAX_EGRESS_HOST_CHARS} characters, matching "
                                   f"{EGRESS_HOST_PATTERN}", extra={"field": "egress"})
    return sorted({host.lower() for host in hosts})


def release_create_image(*, operator: Operator, image: str, version: str, kinds: object, actor: Actor,
                         notes: str = "", default_config: object = None,
                         config_schema: object = None, connections: object = None,
                         egress: object = None) -> AgentRelease:
    """Register a container image pinned by digest as one of ``operator``'s releases (Kubernetes profile).

    Nothing is pulled or run here: the reference and the declared kinds are checked, and the pod that boots the
    image reports what it really loaded (its boot record), which is what rollouts verify.
    """
    _require_artifact(ReleaseArtifact.IMAGE)
    ref = image_parse(image)
    if not isinstance(version, str) or not VERSION_PATTERN.match(version):
        raise ValidationFailed("version must be 1 to 100 letters, digits, '.', '_', '+' or '-', starting with a "
                               "letter or digit (e.g. 1.4.0)")
    declared = _validate_kinds(kinds)
    providers = _validate_connections([] if connections is None else connections)
    hosts = _validate_egress([] if egress is None else egress)
    _validate_notes(notes)
    config = _validate_config({} if default_config is None else default_config)
    # No probe runs an image here: its schema is declared with it, as its kinds are (one object schema).
    schema = schema_merge({"release": config_schema}) if config_schema is not None else None
    config_validate(schema, config, root="default_config")
    _version_is_new(operator, version)
    try:
        with transaction.atomic():
            release = AgentRelease.objects.create(
                operator=operator, version=version, distribution=ref.repository, digest=ref.digest,
                image=ref.pinned, filename="", size_bytes=0, artifact_key="", kinds=declared,
                default_config=config, config_schema=schema, connections=providers, egress=hosts, notes=notes,
                created_by=actor.label)
            audit_record(actor=actor, action=AuditAction.RELEASE_CREATE, target=release, operator=operator, data={
                "version": version, "digest": ref.digest, "image": ref.pinned, "tag": ref.tag,
                "kinds": sorted(declared), "connections": providers, "egress": hosts})
    except IntegrityError:  # the same version registered concurrently
        raise Conflict(f"release {version} already exists; a version is registered once, bump it") from None
    return release
