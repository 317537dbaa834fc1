"""What a container image reference says about itself, read without pulling it: registry, repository, digest.

The grammar is the OCI distribution reference's (``distribution/reference``): ``[host[:port]/]path[:tag]
[@digest]``, a path of lower-case components separated by ``/``, the first component a registry host only when
it has a ``.`` or a ``:`` or is ``localhost``. A release's image must name its registry (a short name is resolved
per node, by configuration the control plane does not see) and be pinned by a ``sha256`` digest: a tag can be
moved to other bytes, a digest cannot. A tag beside the digest is allowed and dropped; the digest is what runs.

Everything here is refused with the cause named (``ValidationFailed``). No I/O here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from controlplane.errors import ValidationFailed

__all__ = ["ImageRef", "image_parse", "MAX_NAME_CHARS"]

MAX_NAME_CHARS = 255  # the reference grammar's limit on registry + repository

_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|-+)"
_PATH_COMPONENT = re.compile(rf"^{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*$")
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = re.compile(rf"^(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?$")
_TAG = re.compile(r"^[\w][\w.-]{0,127}$")
_SHA256 = re.compile(r"^sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class ImageRef:
    registry: str  # host[:port]
    repository: str  # the path inside the registry, e.g. "acme/agent"
    digest: str  # "sha256:<64 lowercase hex>"
    tag: str = ""  # as given (informational: the digest is what runs)

    @property
    def pinned(self) -> str:
        """The reference instances pull: by digest alone, so the tag cannot change what runs."""
        return f"{self.registry}/{self.repository}@{self.digest}"


def _split_digest(reference: str) -> tuple[str, str]:
    name, at, digest = reference.partition("@")
    if not at:
        raise ValidationFailed("the image must be pinned by digest (`<registry>/<repository>@sha256:<64 hex>`): "
                               "a tag alone can be moved to other bytes")
    if not _SHA256.match(digest):
        raise ValidationFailed(f"the image's digest {digest[:80]!r} must be sha256:<64 lowercase hexadecimal "
                               "characters>")
    return name, digest


def _split_tag(name: str) -> tuple[str, str]:
    slash, colon = name.rfind("/"), name.rfind(":")
    if colon > slash:  # a ":" after the last "/" is a tag, not a registry port
        name, tag = name[:colon], name[colon + 1:]
        if not _TAG.match(tag):
            raise ValidationFailed(f"the image's tag {tag[:80]!r} is not a valid tag ([A-Za-z0-9_][A-Za-z0-9_.-], "
                                   "at most 128 characters)")
        return name, tag
    return name, ""


def image_parse(reference: object) -> ImageRef:
    """``reference`` read as a digest-pinned image with its registry named; ValidationFailed names what is wrong."""
    if not isinstance(reference, str) or not reference.strip():
        raise ValidationFailed("image must be a reference such as registry.example.com/acme/agent@sha256:<64 hex>")
    if reference != reference.strip() or any(c.isspace() for c in reference):
        raise ValidationFailed("the image reference must not contain whitespace")
    name, digest = _split_digest(reference)
    name, tag = _split_tag(name)
    if len(name) > MAX_NAME_CHARS:
        raise ValidationFailed(f"the image's name is longer than {MAX_NAME_CHARS} characters")
    first, slash, rest = name.partition("/")
    if not slash or not ("." in first or ":" in first or first == "localhost"):
        raise ValidationFailed(f"the image {name[:80]!r} must name its registry (e.g. registry.example.com/"
                               f"{name[:40]}): a short name is resolved by each node's own configuration")
    if not _HOST.match(first):
        raise ValidationFailed(f"the image's registry {first[:80]!r} is not a host name or host:port")
    for component in rest.split("/"):
        if not _PATH_COMPONENT.match(component):
            raise ValidationFailed(f"the image's repository {rest[:120]!r} is not valid: each '/'-separated part is "
                                   "lower-case letters and digits, joined by '.', '_', '__' or '-'")
    return ImageRef(registry=first, repository=rest, digest=digest, tag=tag)
