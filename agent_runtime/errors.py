"""The one error hierarchy of agent_runtime; every error names what is wrong and the safe state left."""

from __future__ import annotations


class RuntimeStateError(Exception):
    """Base class: something about durable agent state prevents a safe action."""


class ConfigError(RuntimeStateError):
    """The environment does not describe a usable instance."""


class HostAlreadyRunning(RuntimeStateError):
    """Another agent-host holds the single-writer lock for this schema."""


class SchemaTooNew(RuntimeStateError):
    """The tenant schema (or a row in it) was written by a newer runtime than this one."""


class CorruptState(RuntimeStateError):
    """A stored row failed its checksum or could not be decoded (truncated, edited, bit rot)."""


class SnapshotMissing(RuntimeStateError):
    """A workspace snapshot or index backup that a record points to is absent from the object store."""


class RestoreRefused(RuntimeStateError):
    """A checkpoint's dependencies (workspace digest, ledger position) do not match the world."""


class JudgmentInvalid(RuntimeStateError):
    """No passing judgment is bound to the artifact digest as it is now."""


class EffectInDoubt(RuntimeStateError):
    """An effect's intent was recorded but its outcome is unknown and cannot be asked of the provider."""


class EffectFailed(RuntimeStateError):
    """The provider refused the effect; the failure is recorded in the ledger."""


class CredentialUnavailable(RuntimeStateError):
    """The credential source does not hold (or no longer holds: revoked) the named credential.

    `name` (the credential's name, never its value) lets the host block the task on that credential and resume
    it by itself once the source holds it again."""

    def __init__(self, message: str, *, name: str | None = None) -> None:
        super().__init__(message)
        self.name = name


class ConnectionUnavailable(RuntimeStateError):
    """The tenant's connected account at `provider` cannot give a token now.

    `transient` False: the connection needs the customer (needs_reauth, disconnected, never connected); the host
    blocks the task `connection_needs_reauth` and resumes it by itself once the customer connects again. True: the
    control plane or the provider did not answer; the task waits and is tried again. Never carries a token."""

    def __init__(self, message: str, *, provider: str, transient: bool) -> None:
        super().__init__(message)
        self.provider = provider
        self.transient = transient


class TaskBlocked(RuntimeStateError):
    """The task cannot go on without a human decision; `reason` is recorded on the task row."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class ObjectKeyRefused(RuntimeStateError):
    """An object-store key tried to leave the tenant prefix (absolute path, `..`)."""


class EffectKeyConflict(RuntimeStateError):
    """An explicit effect key came back with different arguments: one key names one call, never two."""


class AgentLoadError(RuntimeStateError):
    """The instance's agent package could not be loaded (import error, names nothing, conflicting kinds)."""


class WorkspaceRefused(RuntimeStateError):
    """The workspace holds an entry a digest cannot vouch for (a symlink leaving it, a device node)."""
