"""Allow-list entries and their matching: pure values and functions, no Django, no I/O.

An entry is ``host[:port]``: an exact host (``api.openai.com``, an IP literal) or a wildcard ``*.suffix`` that
matches every name under the suffix but not the suffix itself (``*.stripe.com`` matches ``api.stripe.com``, not
``stripe.com``: list both when both are meant). Without a port an entry allows the web ports only (443 and 80):
an agent that needs SMTP or a database port must say so.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["DEFAULT_PORTS", "HOST_PATTERN", "AllowList", "HostRule", "host_normalize", "rule_parse"]

DEFAULT_PORTS = frozenset({443, 80})
_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
# What the API takes as a rule's host, stated in its schema: a DNS name of ASCII labels (an IPv4 literal is one),
# or ``*.`` and at least two labels; no port (the ``port`` field), no trailing dot, no IPv6 literal. Everything it
# matches within 253 characters, ``rule_parse`` accepts, so a schema-valid rule is never refused.
_L = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOST_PATTERN = rf"^(?:\*\.{_L}(?:\.{_L})+|{_L}(?:\.{_L})*)$"


def host_normalize(host: str) -> str:
    """Lower case, no trailing dot, IDNA for a non-ASCII name, brackets off an IPv6 literal; ValueError when it is
    neither a DNS name nor an IP address (the proxy answers 400, the API 400)."""
    host = host.strip().rstrip(".").lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    if not host.isascii():
        host = host.encode("idna").decode("ascii")
    if len(host) > 253 or not all(_LABEL.match(label) for label in host.split(".")):
        raise ValueError(f"not a host name: {host[:80]!r}")
    return host


@dataclass(frozen=True)
class HostRule:
    host: str  # normalized; "*.suffix" for a wildcard
    port: int | None = None  # None: DEFAULT_PORTS

    def matches(self, host: str, port: int) -> bool:
        if port not in ((self.port,) if self.port is not None else DEFAULT_PORTS):
            return False
        if self.host.startswith("*."):
            return host.endswith(self.host[1:])
        return host == self.host

    def __str__(self) -> str:
        return self.host if self.port is None else f"{self.host}:{self.port}"


def rule_parse(host: str, port: int | None = None) -> HostRule:
    """A rule from the operator's input (``host`` may carry ``:port`` itself); ValueError says what is wrong."""
    host = host.strip()
    if port is None and host.count(":") == 1:  # host:port (an IPv6 literal has several colons)
        host, _, port_text = host.partition(":")
        if not port_text.isdigit():
            raise ValueError("port must be a number")
        port = int(port_text)
    if port is not None and not 1 <= port <= 65535:
        raise ValueError("port must be between 1 and 65535")
    if host.startswith("*."):
        suffix = host_normalize(host[2:])
        if suffix.count(".") < 1:
            raise ValueError("a wildcard needs at least two labels after '*.' (*.example.com, not *.com)")
        return HostRule(f"*.{suffix}", port)
    if "*" in host:
        raise ValueError("a wildcard is only allowed as a leading '*.'")
    return HostRule(host_normalize(host), port)


@dataclass(frozen=True)
class AllowList:
    rules: tuple[HostRule, ...] = ()

    @classmethod
    def of(cls, rules: Iterable[HostRule]) -> AllowList:
        return cls(tuple(sorted(set(rules), key=str)))

    def permits(self, host: str, port: int) -> bool:
        return any(rule.matches(host, port) for rule in self.rules)
