"""Host paths out of public text: what an API answer, a problem's detail or an event may say instead.

Error text is built from exceptions (an install that failed under ``RELEASES_ROOT/envs/<hex>/``, a probe that
names a directory under the object store's root) and a local driver names its resources by ``file://`` URLs.
None of that is the operator's business, and it tells an attacker how the host is laid out (docs/api.md: "no
host paths in answers"). ``scrub_host_paths`` rewrites every path under the control plane's own roots into a
stable name that is not a path:

- ``RELEASES_ROOT/envs/<hex>[/...]`` -> ``release:sha256:<hex>[/...]`` (the release's digest: operators know it)
- ``RELEASES_ROOT/wheels/<operator>/<hex>.whl`` -> ``wheel:sha256:<hex>``
- ``LOCAL_OBJECTSTORE_ROOT/<key>`` -> ``objectstore://<key>`` (the key, as S3 would name it)
- ``LOCAL_VOLUME_ROOT/<dir>`` -> ``volume:<dir>``; any other path under ``RELEASES_ROOT`` or ``VAR_DIR``
  -> ``releases:<rest>`` / ``var:<rest>``.

Each in its plain and its ``file://`` form. Reads settings only; no I/O here.
"""

from __future__ import annotations

import re
import urllib.parse
from functools import lru_cache, partial
from pathlib import Path
from typing import Any, TypeVar, cast

from django.conf import settings
from rest_framework import serializers

__all__ = ["PublicTextField", "host_path_roots", "scrub_host_paths", "scrub_json"]

# What follows a root, up to the end of the path-ish token (a quote, a space, a separator ends it).
_REST = r"(?P<rest>/[^\s'\"<>,;:)\]]*)?"

def host_path_roots() -> list[Path]:
    """The roots no public text may name: the var root and the object store's and releases' own."""
    return [Path(settings.VAR_DIR), Path(settings.LOCAL_OBJECTSTORE_ROOT), Path(settings.RELEASES_ROOT),
            Path(settings.LOCAL_VOLUME_ROOT)]


def _either(root: Path) -> str:
    """A pattern for ``root`` as a path or as a ``file://`` URL (percent-encoded the way ``as_uri`` does)."""
    plain = str(root).rstrip("/")
    quoted = urllib.parse.quote(plain)
    forms = {re.escape(plain), "file://" + re.escape(quoted), "file://" + re.escape(plain)}
    return "(?:" + "|".join(sorted(forms, key=len, reverse=True)) + ")"


@lru_cache(maxsize=8)
def _rules(var: str, objects: str, releases: str, volumes: str) -> tuple[tuple[re.Pattern[str], str], ...]:
    """(pattern, public name) pairs; a name ending in ':' or '//' is followed by what came after the root."""
    rel = Path(releases)
    rules = [
        (re.compile(_either(rel) + r"/envs/(?:sha256:)?(?P<hex>[0-9a-f]{8,64})" + _REST), "release:sha256:"),
        (re.compile(_either(rel) + r"/wheels/[^/\s]+/(?P<hex>[0-9a-f]{8,64})\.whl()"), "wheel:sha256:"),
    ]
    # The more specific root first: by default the others live under the var root.
    named = sorted([(Path(objects), "objectstore:/"), (Path(volumes), "volume:"), (rel, "releases:"),
                    (Path(var), "var:")], key=lambda pair: len(str(pair[0])), reverse=True)
    # A root ends at a '/' or the token's end: /srv/var is not the start of /srv/variants.
    rules += [(re.compile(_either(root) + r"(?![^/\s'\"<>,;:)\]])" + _REST), name) for root, name in named]
    return tuple(rules)


def _public(match: re.Match[str], name: str) -> str:
    groups = match.groupdict()
    rest = groups.get("rest") or ""
    if "hex" in groups:
        return f"{name}{groups['hex']}{rest}"
    return f"{name}{rest or '/'}" if name.endswith("/") else f"{name}{rest.lstrip('/')}"


def scrub_host_paths(text: str) -> str:
    """``text`` with every path under the control plane's roots replaced by its public name (see above)."""
    if not text or "/" not in text:
        return text
    rules = _rules(str(settings.VAR_DIR), str(settings.LOCAL_OBJECTSTORE_ROOT), str(settings.RELEASES_ROOT),
                   str(settings.LOCAL_VOLUME_ROOT))
    for pattern, name in rules:
        text = pattern.sub(partial(_public, name=name), text)
    return text


_J = TypeVar("_J")


def scrub_json(value: _J) -> _J:
    """``value`` (JSON: an instance's answer, an event's data) with ``scrub_host_paths`` applied to every string,
    keys included: an instance's task errors and logs name the release's install directory."""
    out: Any = value
    if isinstance(value, str):
        out = scrub_host_paths(value)
    elif isinstance(value, dict):
        out = {scrub_json(k): scrub_json(v) for k, v in value.items()}
    elif isinstance(value, list):
        out = [scrub_json(v) for v in value]
    return cast("_J", out)


class PublicTextField(serializers.CharField):
    """An output field for text built from errors (a rollout's reason, a status reason, a delivery's error):
    rows written before the scrub, or by a path that forgot it, still answer without host paths."""

    def to_representation(self, value: Any) -> str:
        return scrub_host_paths(super().to_representation(value))
