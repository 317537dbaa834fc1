"""Named outcomes of an egress decision (what the log's ``reason`` column holds)."""

from __future__ import annotations

from django.db import models

__all__ = ["DecisionReason", "RequestKind"]


class DecisionReason(models.TextChoices):
    ALLOWED = "allowed"
    NOT_LISTED = "not_listed"  # the host:port is on none of the tenant's allow-lists
    PRIVATE_ADDRESS = "private_address"  # the host resolves to a loopback/private/link-local/reserved address
    UNRESOLVABLE = "unresolvable"
    UPSTREAM_UNREACHABLE = "upstream_unreachable"
    UPSTREAM_TIMEOUT = "upstream_timeout"
    BAD_REQUEST = "bad_request"  # not CONNECT host:port nor an absolute http:// URL
    POLICY_UNAVAILABLE = "policy_unavailable"  # the allow-list could not be read (database down): refused, 503


class RequestKind(models.TextChoices):
    CONNECT = "CONNECT"  # a tunnel (https): the proxy sees neither the path nor the bytes' meaning
    HTTP = "HTTP"  # a plain-http absolute-form request, forwarded with Connection: close
