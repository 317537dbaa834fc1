"""How long vended S3 session credentials may live: AWS's limits as one pure rule (no Django, no I/O).

STS refuses ``DurationSeconds`` below 900 s, and above 3600 s for a *chained* role session, i.e. when
the caller of AssumeRole is itself on assumed-role credentials (IRSA, an instance profile, an SSO
role): that is how a control plane runs on Kubernetes, so 1 h is the limit unless the operator says
otherwise. With IAM user credentials the role's ``MaxSessionDuration`` (at most 12 h) applies.
``controlplane/settings.py`` calls this at import (a bad value refuses to start), which is why it lives in the
lowest layer, and the S3 driver's ``vend_credentials`` again at every vend (the value can change under a running
process in tests).
"""

from __future__ import annotations

__all__ = ["CHAINED_SESSION_MAX_S", "SESSION_MAX_S", "SESSION_MIN_S", "session_duration_problem"]

SESSION_MIN_S = 900
CHAINED_SESSION_MAX_S = 3600
SESSION_MAX_S = 43200


def session_duration_problem(*, duration_s: int, renew_before_s: int, not_chained: bool) -> str | None:
    """Why ``S3_CREDENTIALS_DURATION_S`` / ``S3_CREDENTIALS_RENEW_BEFORE_S`` cannot work, or None."""
    if duration_s < SESSION_MIN_S:
        return f"S3_CREDENTIALS_DURATION_S={duration_s} is below the {SESSION_MIN_S} s STS accepts"
    if duration_s > SESSION_MAX_S:
        return f"S3_CREDENTIALS_DURATION_S={duration_s} is above the {SESSION_MAX_S} s STS accepts"
    if duration_s > CHAINED_SESSION_MAX_S and not not_chained:
        return (f"S3_CREDENTIALS_DURATION_S={duration_s} exceeds the {CHAINED_SESSION_MAX_S} s AWS allows for a "
                "chained role session (the control plane on assumed-role credentials: IRSA, an instance profile); "
                f"set it to {CHAINED_SESSION_MAX_S} or less (instances renew before expiry), or set "
                "S3_ROLE_SESSION_NOT_CHAINED=true if the control plane calls AssumeRole with IAM user credentials "
                "and the role's MaxSessionDuration allows it")
    if not 0 < renew_before_s < duration_s:
        return (f"S3_CREDENTIALS_RENEW_BEFORE_S={renew_before_s} must be above 0 and below "
                f"S3_CREDENTIALS_DURATION_S={duration_s}, or credentials would be renewed at every use")
    return None
