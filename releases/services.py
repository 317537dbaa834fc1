"""Registering an operator's agent release: checked, installed, probed, then recorded; never half of it.

The wheel is kept under its digest (``RELEASES_ROOT/wheels/<operator>/<hex>.whl``) and installed once per
digest (``RELEASES_ROOT/envs/<hex>/``), where a later session's instances will load it from. Every check
runs before anything is recorded, and a failed upload leaves nothing behind: its scratch directory is
removed whatever happens, and the row is written last.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction

from controlplane.errors import Conflict, PayloadTooLarge, ValidationFailed
from tenants.actors import Actor
from tenants.audit import audit_record
from tenants.models import Operator

from .models import AgentRelease
from .selectors import release_env_dir
from .validation import release_install_and_probe
from .wheels import missing_dependencies, sha256_digest, wheel_inspect

__all__ = ["release_create", "release_env_dir", "MAX_NOTES_CHARS", "MAX_CONFIG_BYTES"]

MAX_NOTES_CHARS = 5_000
MAX_CONFIG_BYTES = 16_384


def _root() -> Path:
    return Path(settings.RELEASES_ROOT)


def _validate_config(default_config: object) -> dict[str, Any]:
    if not isinstance(default_config, dict):
        raise ValidationFailed("default_config must be a JSON object")
    if len(json.dumps(default_config)) > MAX_CONFIG_BYTES:
        raise ValidationFailed(f"default_config must be at most {MAX_CONFIG_BYTES} bytes of JSON")
    return default_config


def release_create(*, operator: Operator, filename: str, data: bytes, actor: Actor, sha256: str | None = None,
                   notes: str = "", default_config: object = None) -> AgentRelease:
    """Validate and register a wheel as one of ``operator``'s releases (its version taken from the wheel)."""
    if len(data) > settings.RELEASE_MAX_WHEEL_BYTES:
        raise PayloadTooLarge(f"the wheel is larger than {settings.RELEASE_MAX_WHEEL_BYTES} bytes",
                              extra={"max_bytes": settings.RELEASE_MAX_WHEEL_BYTES})
    if not isinstance(notes, str) or len(notes) > MAX_NOTES_CHARS or "\x00" in notes:
        raise ValidationFailed(f"notes must be at most {MAX_NOTES_CHARS} characters")
    config = _validate_config({} if default_config is None else default_config)
    info = wheel_inspect(Path(filename).name, data, expected_digest=sha256)
    if AgentRelease.objects.filter(operator=operator, version=info.version).exists():
        raise Conflict(f"release {info.version} already exists; a version is registered once, bump it")
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
        kept = _root() / "wheels" / str(operator.pk) / f"{digest[7:]}.whl"
        kept.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        wheel.replace(kept)
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
                    artifact_key=str(kept.relative_to(_root())), kinds=probed.kinds, default_config=config,
                    notes=notes, created_by=actor.label)
                audit_record(actor=actor, action="release.create", target=release, operator=operator, data={
                    "version": info.version, "digest": digest, "kinds": sorted(probed.kinds),
                    "isolation": probed.isolation})
        except IntegrityError:  # the same version uploaded concurrently
            raise Conflict(f"release {info.version} already exists; a version is registered once, bump it") from None
        return release
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
