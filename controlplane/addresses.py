"""The one test of "may the control plane (or a tenant, through the egress proxy) connect to this address".

Server-side request forgery guard shared by OAuth (``connections.oauth``), webhooks (``webhooks.targets``) and the
egress proxy (``egress.proxy``): each resolves a host itself and must refuse it if any address it resolves to is
loopback, private, link-local (cloud metadata at 169.254.169.254), shared (100.64/10), multicast or reserved. One
predicate, so a range one caller learns to refuse is refused by all. No I/O here: callers resolve, then ask.
"""

from __future__ import annotations

import ipaddress

__all__ = ["is_public_address"]


def is_public_address(address: str) -> bool:
    """``ipaddress``'s ``is_global`` and not multicast; an IPv4-mapped IPv6 address (::ffff:10.0.0.5) is judged as
    the IPv4 address it carries, and an IPv6 scope (fe80::1%eth0) is dropped (such an address is link-local
    anyway). Not an IP address at all: ValueError, as ``ipaddress`` raises it."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast
