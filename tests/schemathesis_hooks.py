"""Hooks for `schemathesis run` against this API (loaded by schemathesis.toml at the repository root).

One thing a schema cannot say: an ``Idempotency-Key`` names one request. The fuzzer reuses the few values it
generates across different bodies, which the API answers, as the IETF idempotency-key draft requires, with
422 ``idempotency-key-reused``: correct, but it hides whether the body itself would have been accepted. So a
well-formed key is made unique per request (its generated part kept); a malformed one is left as generated,
so the negative checks still see it refused. Key reuse itself is tested in tests/tenants/test_api_tenants.py and
tests/conversations/test_conversations_api.py.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import schemathesis

_WELL_FORMED = re.compile(r"[^\x00-\x1f\x7f]{1,200}")  # controlplane.openapi.IDEMPOTENCY_KEY_SCHEMA


@schemathesis.hook
def before_call(ctx: Any, case: Any, **kwargs: Any) -> None:
    # Positive cases only: a changed case is re-validated, and a negative one (e.g. the coverage phase's "no
    # Authorization header") would then count as positive and go out with the CLI's token. A negative case
    # expects a 4xx anyway, which a reused key's 422 is.
    if case.meta is not None and case.meta.generation.mode.is_negative:
        return
    key = (case.headers or {}).get("Idempotency-Key")
    if isinstance(key, str) and _WELL_FORMED.fullmatch(key):
        case.headers["Idempotency-Key"] = f"{key[:160]}-{uuid.uuid4().hex}"
