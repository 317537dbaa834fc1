"""End users of a tenant: the people an operator's customer serves (a company's employees), each named by an opaque
id the operator chooses (``end_user``). Validation only, no I/O: the id is a key, not a profile, and the control
plane stores nothing else about the person.

Connections (``connections``) can belong to one end user, and tasks and messages (``conversations``) can act for
one; both apps validate the id here, so the same string names the same person everywhere.
"""

from __future__ import annotations

import re

from django.core.validators import RegexValidator

from controlplane.errors import ValidationFailed
from controlplane.strict import JSONString, no_final_newline

__all__ = ["END_USER_MAX", "END_USER_PATTERN", "end_user_field", "validate_end_user"]

END_USER_MAX = 128
# Opaque to us, so a tight alphabet: no spaces, no control characters, nothing a log line or a URL would mangle. The
# API's schema states the same pattern (the serializers' fields), so a schema-valid id is never refused.
END_USER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}$"
_END_USER_RE = re.compile(END_USER_PATTERN)
_END_USER_RULE = (f"end_user must be 1-{END_USER_MAX} characters of A-Z a-z 0-9 . _ : @ + -, starting with a letter "
                  "or digit")


def end_user_field(help_text: str) -> JSONString:
    """An API input field for an end user's id, optional and nullable: the schema carries the pattern
    (drf-spectacular reads it from the validator), so a schema-valid id is never refused."""
    return JSONString(required=False, allow_null=True, default=None, max_length=END_USER_MAX, help_text=help_text,
                      trim_whitespace=False,  # kept as sent: " a" is not "a", and the pattern refuses it
                      validators=[RegexValidator(END_USER_PATTERN, message=_END_USER_RULE), no_final_newline])


def validate_end_user(end_user: object) -> str | None:
    """``end_user`` as stored: None (no end user: the tenant as a whole), else 1-128 characters of
    ``A-Z a-z 0-9 . _ : @ + -`` starting with a letter or digit. Anything else is a 400 that does not echo it."""
    if end_user is None:
        return None
    if not isinstance(end_user, str) or not _END_USER_RE.fullmatch(end_user):
        raise ValidationFailed(_END_USER_RULE)
    return end_user
