"""End users of a tenant: the people an operator's customer serves (a company's employees), each named by an opaque
id the operator chooses (``end_user``). Validation only, no I/O: the id is a key, not a profile, and the control
plane stores nothing else about the person.

Connections (``connections``) can belong to one end user, and tasks and messages (``conversations``) can act for
one; both apps validate the id here, so the same string names the same person everywhere.
"""

from __future__ import annotations

import re

from controlplane.errors import ValidationFailed

__all__ = ["END_USER_MAX", "validate_end_user"]

END_USER_MAX = 128
# Opaque to us, so a tight alphabet: no spaces, no control characters, nothing a log line or a URL would mangle.
_END_USER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}$")


def validate_end_user(end_user: object) -> str | None:
    """``end_user`` as stored: None (no end user: the tenant as a whole), else 1-128 characters of
    ``A-Z a-z 0-9 . _ : @ + -`` starting with a letter or digit. Anything else is a 400 that does not echo it."""
    if end_user is None:
        return None
    if not isinstance(end_user, str) or not _END_USER_RE.fullmatch(end_user):
        raise ValidationFailed(f"end_user must be 1-{END_USER_MAX} characters of A-Z a-z 0-9 . _ : @ + -, starting "
                               "with a letter or digit")
    return end_user
