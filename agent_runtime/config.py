"""HostConfig: everything agent-host needs, read only from environment variables (no I/O besides env)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from agent_runtime.crypto import decode_key
from agent_runtime.db import check_schema_name
from agent_runtime.errors import ConfigError

__all__ = ["HostConfig"]


def _req(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "")
    if not value:
        raise ConfigError(f"{name} is required")
    return value


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    try:
        return float(env.get(name, default))
    except ValueError as exc:
        raise ConfigError(f"{name} must be a number") from exc


@dataclass(frozen=True)
class HostConfig:
    tenant_id: str
    schema: str
    database_url: str = field(repr=False)
    volume: Path
    objectstore_url: str
    object_key: bytes = field(repr=False)
    # Older object-key versions kept after a rotation, to read objects written before it.
    previous_object_keys: tuple[bytes, ...] = field(default=(), repr=False)
    http_host: str = "127.0.0.1"
    http_port: int = 0
    control_plane_url: str | None = None
    instance_token: str | None = field(default=None, repr=False)
    heartbeat_interval_s: float = 2.0
    step_timeout_s: float = 30.0
    grace_period_s: float = 10.0
    poll_interval_s: float = 0.2
    checkpoint_interval_s: float = 5.0
    checkpoint_keep_latest: int = 5
    step_max_attempts: int = 3
    memory_token_budget: int = 4000
    on_workspace_mismatch: str = "refuse"  # or "fork"
    smtp_url: str | None = None
    payments_url: str | None = None
    planner: str = "deterministic"
    llm_url: str | None = None
    llm_model: str = "gpt-4o-mini"
    embedder: str = "hash"

    @property
    def workspace(self) -> Path:
        return self.volume / "workspace"

    @property
    def host_dir(self) -> Path:
        return self.volume / ".host"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> HostConfig:
        env = os.environ if env is None else env
        tenant_id = _req(env, "AGENT_TENANT_ID")
        try:
            uuid.UUID(tenant_id)
        except ValueError as exc:
            raise ConfigError("AGENT_TENANT_ID must be a UUID") from exc
        mismatch = env.get("AGENT_ON_WORKSPACE_MISMATCH", "refuse")
        if mismatch not in ("refuse", "fork"):
            raise ConfigError("AGENT_ON_WORKSPACE_MISMATCH must be 'refuse' or 'fork'")
        return cls(
            tenant_id=tenant_id,
            schema=check_schema_name(_req(env, "AGENT_SCHEMA")),
            database_url=_req(env, "AGENT_DATABASE_URL"),
            volume=Path(_req(env, "AGENT_VOLUME")).resolve(),
            objectstore_url=_req(env, "AGENT_OBJECTSTORE_URL"),
            object_key=decode_key(_req(env, "AGENT_OBJECT_KEY")),
            previous_object_keys=tuple(
                decode_key(k) for k in env.get("AGENT_OBJECT_KEYS_PREVIOUS", "").split(",") if k.strip()
            ),
            http_host=env.get("AGENT_HTTP_HOST", "127.0.0.1"),
            http_port=int(env.get("AGENT_HTTP_PORT", "0")),
            control_plane_url=env.get("AGENT_CONTROL_PLANE_URL") or None,
            instance_token=env.get("AGENT_INSTANCE_TOKEN") or None,
            heartbeat_interval_s=_float(env, "AGENT_HEARTBEAT_INTERVAL_S", 2.0),
            step_timeout_s=_float(env, "AGENT_STEP_TIMEOUT_S", 30.0),
            grace_period_s=_float(env, "AGENT_GRACE_PERIOD_S", 10.0),
            poll_interval_s=_float(env, "AGENT_POLL_INTERVAL_S", 0.2),
            checkpoint_interval_s=_float(env, "AGENT_CHECKPOINT_INTERVAL_S", 5.0),
            checkpoint_keep_latest=int(env.get("AGENT_CHECKPOINT_KEEP", "5")),
            step_max_attempts=int(env.get("AGENT_STEP_MAX_ATTEMPTS", "3")),
            memory_token_budget=int(env.get("AGENT_MEMORY_TOKEN_BUDGET", "4000")),
            on_workspace_mismatch=mismatch,
            smtp_url=env.get("AGENT_SMTP_URL") or None,
            payments_url=env.get("AGENT_PAYMENTS_URL") or None,
            planner=env.get("AGENT_PLANNER", "deterministic"),
            llm_url=env.get("AGENT_LLM_URL") or None,
            llm_model=env.get("AGENT_LLM_MODEL", "gpt-4o-mini"),
            embedder=env.get("AGENT_EMBEDDER", "hash"),
        )
