"""The form of an outbound URL, as one regular expression that is both the server's check and the schema's pattern.

Webhook endpoints and MCP servers take a URL the control plane (or an instance) will call. What a schema can say
about it is its form: the scheme, a host (an RFC 3986 IPv6 literal when bracketed), no credentials, a port
1-65535. Whether the host resolves to a public address no schema can say; the services check that (DNS) and
answer 400 with the reason. No I/O here.
"""

from __future__ import annotations

import re

from django.conf import settings
from django.core.validators import RegexValidator

__all__ = ["URLFormValidator"]

_PORT = "(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
# A bracketed host is an IPv6 address as RFC 3986 writes it (``IPv6address``), not any mix of hex digits and
# colons: ``https://[:]`` used to match the pattern and then be refused as no URL (a 400 the schema hid).
_H16 = "[0-9A-Fa-f]{1,4}"
_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_LS32 = rf"(?:{_H16}:{_H16}|{_OCTET}(?:\.{_OCTET}){{3}})"
IPV6 = "(?:" + "|".join([
    rf"(?:{_H16}:){{6}}{_LS32}",
    rf"::(?:{_H16}:){{5}}{_LS32}",
    rf"(?:{_H16})?::(?:{_H16}:){{4}}{_LS32}",
    rf"(?:(?:{_H16}:){{0,1}}{_H16})?::(?:{_H16}:){{3}}{_LS32}",
    rf"(?:(?:{_H16}:){{0,2}}{_H16})?::(?:{_H16}:){{2}}{_LS32}",
    rf"(?:(?:{_H16}:){{0,3}}{_H16})?::{_H16}:{_LS32}",
    rf"(?:(?:{_H16}:){{0,4}}{_H16})?::{_LS32}",
    rf"(?:(?:{_H16}:){{0,5}}{_H16})?::{_H16}",
    rf"(?:(?:{_H16}:){{0,6}}{_H16})?::",
]) + ")"


class URLFormValidator(RegexValidator):
    """https (http too where the setting ``allow_http_setting`` is true), read when it is used and when the schema
    is generated, so the pattern clients see is the check the server makes."""

    def __init__(self, *, allow_http_setting: str, message: str) -> None:
        self.allow_http_setting = allow_http_setting
        super().__init__(message=message)

    @property
    def regex(self) -> re.Pattern[str]:
        scheme = "https?" if getattr(settings, self.allow_http_setting) else "https"
        return re.compile(rf"^{scheme}://(\[{IPV6}\]|[^/?#@:\[\]\s\x00]+)(:{_PORT})?([/?#][^\s\x00]*)?$")

    @regex.setter
    def regex(self, _value: object) -> None:  # RegexValidator.__init__ assigns it
        pass
