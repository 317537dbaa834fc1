"""Which browser origins may call the customer-token endpoints: the operators' own domains.

django-cors-headers asks (signal ``check_request_enabled``) for every request; a True answer both enables CORS
for the URL and allows the origin, so the URL is checked here too (``CORS_URLS_REGEX``). An origin is allowed
when its host is one of an operator's domains (``Operator.domains``, the same list that routes its portal).
Which tenant a request reaches is decided by its token, not by its origin: this only lets the browser send it.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from tenants.models import Operator

__all__ = ["allow_operator_origin"]


def allow_operator_origin(sender: Any, request: Any, **kwargs: Any) -> bool:
    if not re.match(settings.CORS_URLS_REGEX, request.path_info):
        return False
    origin = request.headers.get("Origin", "")
    try:
        parts = urlsplit(origin)
    except ValueError:
        return False
    host = (parts.hostname or "").lower()
    if parts.scheme not in ("https", "http") or not host or len(host) > 253:
        return False
    return Operator.objects.filter(domains__contains=[host]).exists()
