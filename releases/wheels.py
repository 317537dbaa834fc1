"""What an uploaded file says about itself, read without running it: a wheel's name, version and needs.

Everything here is refused with the cause named (``ValidationFailed``): a file that is not a wheel, a digest
that does not match, an archive with paths outside itself, or a dependency the runtime does not have (the
release is installed without dependencies, on top of the runtime's own environment, so a missing one would
only fail later, inside an instance).
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from dataclasses import dataclass, field
from email.parser import HeaderParser
from importlib import metadata

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from controlplane.errors import ValidationFailed

__all__ = ["WheelInfo", "wheel_inspect", "sha256_digest", "missing_dependencies"]


@dataclass(frozen=True)
class WheelInfo:
    distribution: str
    version: str
    requires: list[str] = field(default_factory=list)


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def wheel_inspect(filename: str, data: bytes, *, expected_digest: str | None = None) -> WheelInfo:
    """The wheel's identity from its file name and METADATA; ValidationFailed names what is wrong."""
    if expected_digest:
        want = expected_digest.lower().removeprefix("sha256:")
        if len(want) != 64 or any(c not in "0123456789abcdef" for c in want):
            raise ValidationFailed("sha256 must be 64 hexadecimal characters (optionally prefixed sha256:)")
        if sha256_digest(data) != f"sha256:{want}":
            raise ValidationFailed(f"digest mismatch: the file's sha256 is {sha256_digest(data)[7:]}, not {want}")
    try:
        name, version, _build, _tags = parse_wheel_filename(filename)
    except InvalidWheelFilename as exc:
        raise ValidationFailed(f"not a wheel: {exc}") from None
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        raise ValidationFailed("not a wheel: the file is not a zip archive") from None
    with archive:
        names = archive.namelist()
        unsafe = [n for n in names if n.startswith("/") or ".." in n.split("/") or "\\" in n]
        if unsafe:
            raise ValidationFailed(f"not a wheel: the archive has paths outside itself ({unsafe[0]!r})")
        dist_info = {n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".dist-info")}
        if len(dist_info) != 1:
            raise ValidationFailed("not a wheel: it must hold exactly one .dist-info directory")
        info_dir = dist_info.pop()
        if f"{info_dir}/METADATA" not in names or f"{info_dir}/WHEEL" not in names:
            raise ValidationFailed(f"not a wheel: {info_dir} has no METADATA or WHEEL file")
        meta = HeaderParser().parsestr(archive.read(f"{info_dir}/METADATA").decode("utf-8", "replace"))
    if canonicalize_name(meta.get("Name", "")) != name or meta.get("Version", "") != str(version):
        raise ValidationFailed(f"not a wheel: its METADATA says {meta.get('Name')} {meta.get('Version')}, its file "
                               f"name {name} {version}")
    return WheelInfo(distribution=str(meta["Name"]), version=str(version),
                     requires=list(meta.get_all("Requires-Dist") or []))


def missing_dependencies(requires: list[str]) -> list[str]:
    """The requirements this environment (the runtime's) does not satisfy, each as ``name (why)``."""
    missing = []
    for line in requires:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            missing.append(f"{line} (not a valid requirement)")
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # for another Python, platform or an extra nobody asked for
        try:
            installed = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            missing.append(f"{req.name} (not installed)")
            continue
        if req.specifier and not req.specifier.contains(installed, prereleases=True):
            missing.append(f"{req.name}{req.specifier} (the runtime has {installed})")
    return missing
