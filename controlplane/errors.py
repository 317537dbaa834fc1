"""The one error hierarchy services raise. The API's exception handler turns each into problem+json.

Messages are written for the caller and must never contain a secret.
"""

from __future__ import annotations

from typing import Any


class ApplicationError(Exception):
    status_code = 400
    title = "Bad request"
    type_slug = "bad-request"

    def __init__(self, detail: str, *, extra: dict[str, Any] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra or {}


class ValidationFailed(ApplicationError):
    status_code = 400
    title = "Invalid input"
    type_slug = "invalid-input"


class NotFound(ApplicationError):
    status_code = 404
    title = "Not found"
    type_slug = "not-found"


class Conflict(ApplicationError):
    status_code = 409
    title = "Conflict"
    type_slug = "conflict"


class InvalidTransition(Conflict):
    title = "Invalid state transition"
    type_slug = "invalid-transition"


class ReleaseArtifactUnsupported(Conflict):
    """A release of the other kind than this control plane's instances run (a wheel where they run on
    Kubernetes, an image where they are local processes): nothing of it could ever start."""

    title = "Release artifact not supported here"
    type_slug = "release-artifact-unsupported"


class NoDefaultRelease(Conflict):
    """Onboarding while the operator has no default release: the customer would run whatever the runtime has
    installed. Refused unless the request says ``allow_no_release: true``."""

    title = "No default release"
    type_slug = "no-default-release"


class PayloadTooLarge(ApplicationError):
    """A body past a documented size limit (a release wheel, say); the limit goes in ``extra``."""

    status_code = 413
    title = "Payload too large"
    type_slug = "payload-too-large"


class QuotaExceeded(ApplicationError):
    status_code = 429
    title = "Quota exceeded"
    type_slug = "quota-exceeded"

    def __init__(self, detail: str, *, extra: dict[str, Any] | None = None, retry_after_s: int | None = None
                 ) -> None:
        super().__init__(detail, extra=extra)
        # When the quota frees itself (a plan's month resets), in seconds; None: the handler's default.
        self.retry_after_s = retry_after_s


class MonthlyLimitReached(QuotaExceeded):
    """The plan's monthly limit (tasks or model tokens, UTC calendar month) is used up: new tasks and messages
    are refused until the month resets; running work is not stopped."""

    title = "Monthly limit reached"
    type_slug = "monthly-limit-reached"


class ProvisioningError(ApplicationError):
    """An external system refused or failed a provisioning step; retried with backoff by the workflow."""

    status_code = 502
    title = "Provisioning failed"
    type_slug = "provisioning-failed"


class VaultError(ApplicationError):
    status_code = 500
    title = "Vault error"
    type_slug = "vault-error"


class DecryptionFailed(VaultError):
    """A ciphertext failed authentication: tampered, moved to another row/tenant, or the wrong key."""

    title = "Decryption failed"
    type_slug = "decryption-failed"


class KeyRingMismatch(VaultError):
    """This process's key-encryption keys are not the ones a data key was wrapped with, or not the ones
    on disk. Not tampering: a process started with another key ring. Another process may still serve
    the request (503), and this one must not wrap anything until it is restarted with the right ring."""

    status_code = 503
    title = "Vault key ring mismatch"
    type_slug = "vault-key-ring-mismatch"
