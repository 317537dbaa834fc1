"""Release wheels in the control plane's object store, and this machine's cache of their installs.

A wheel is kept once per digest, ``releases/<sha256 hex>.whl`` in the shared store
(``provisioning.drivers.shared_store``: ``LOCAL_OBJECTSTORE_ROOT/controlplane/`` or ``S3_BUCKET`` under
``controlplane/``), whichever machine's web process accepted it. ``RELEASES_ROOT/envs/<hex>/`` on each machine
is only a cache: ``release_installed`` makes it from the stored wheel the first time this machine needs it
(after a wipe of ``var/``, on a machine that never saw the upload), and refuses bytes that are not the digest's.
The wheel was validated (installed and probed) when it was uploaded; the digest proves these are those bytes, so
here it is only installed.
"""

from __future__ import annotations

import logging
import shutil
import uuid
from pathlib import Path

from django.conf import settings

from controlplane.errors import ProvisioningError, ValidationFailed
from provisioning.drivers.shared_store import SharedObjectMissing, shared_store

from .models import AgentRelease
from .selectors import release_env_dir
from .validation import release_install
from .wheels import sha256_digest

__all__ = ["release_installed", "release_wheel_key", "release_wheel_store"]

log = logging.getLogger(__name__)


def release_wheel_key(digest: str) -> str:
    """The wheel's key in the shared store: its digest, nothing the uploader chose."""
    hexdigest = digest.removeprefix("sha256:")
    if not digest.startswith("sha256:") or len(hexdigest) != 64 or not all(c in "0123456789abcdef" for c in hexdigest):
        raise ProvisioningError(f"{digest[:80]!r} is not a sha256 digest")
    return f"releases/{hexdigest}.whl"


def release_wheel_store(*, digest: str, data: bytes) -> str:
    """Keep the wheel in the shared store under its digest (once: the same bytes are the same object); its key."""
    if sha256_digest(data) != digest:
        raise ProvisioningError(f"refusing to store a wheel under {digest}: its bytes have another digest")
    key = release_wheel_key(digest)
    store = shared_store()
    if not store.exists(key):
        store.put(key, data)
    return key


def _legacy_wheel(digest: str) -> bytes | None:
    """A wheel kept on this machine's disk before the object store held them (``RELEASES_ROOT/wheels/<op>/``)."""
    for key in AgentRelease.objects.filter(digest=digest, artifact_key__startswith="wheels/").values_list(
            "artifact_key", flat=True):
        path = Path(settings.RELEASES_ROOT) / key
        if path.is_file():
            return path.read_bytes()
    return None


def release_installed(digest: str) -> Path:
    """The install directory of the release with ``digest`` on this machine, installed from the shared store
    first when it is missing here. ``ProvisioningError`` says why it cannot be: not a registered wheel, missing
    from the store, or stored bytes that are not the digest's (then nothing is installed)."""
    env = release_env_dir(digest)
    if env.is_dir():
        return env
    key = release_wheel_key(digest)
    filename = (AgentRelease.objects.filter(digest=digest, image="").exclude(filename="")
                .values_list("filename", flat=True).first())
    if filename is None:
        raise ProvisioningError(f"no wheel release has the digest {digest}")
    store = shared_store()
    try:
        data = store.get(key)
    except SharedObjectMissing:
        legacy = _legacy_wheel(digest)
        if legacy is None:
            raise ProvisioningError(f"the wheel of release {digest} is missing from the object store "
                                    f"({store.url(key)})") from None
        data = legacy
        if sha256_digest(data) == digest:
            store.put(key, data)  # moved where every machine finds it
    found = sha256_digest(data)
    if found != digest:
        log.error("a stored release wheel does not match its digest", extra={
            "event": "release_wheel_digest_mismatch", "digest": digest, "found": found, "key": key})
        raise ProvisioningError(f"the stored wheel of release {digest} does not match its digest (its bytes are "
                                f"{found}): refusing to install it; restore {store.url(key)} or upload the "
                                "release again")
    scratch = Path(settings.RELEASES_ROOT) / f"tmp-{uuid.uuid4().hex}"
    scratch.mkdir(parents=True, mode=0o700)
    try:
        wheel = scratch / Path(filename).name
        wheel.write_bytes(data)
        try:
            release_install(wheel, scratch / "site")
        except ValidationFailed as exc:
            raise ProvisioningError(f"release {digest} does not install on this machine: {exc}") from None
        env.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        try:
            (scratch / "site").replace(env)
        except OSError:  # installed concurrently by another process here: the same bytes, as good
            if not env.is_dir():
                raise
        log.info("release installed from the object store", extra={
            "event": "release_install_from_store", "digest": digest})
        return env
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
