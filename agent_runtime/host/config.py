"""HostConfig: everything agent-host needs, read only from environment variables (no I/O besides env).

`ENVIRONMENT` lists every variable the host reads, with its default and meaning; `agent-host --help`
prints it and docs/sdk.md points to it, so the list cannot drift from the code that reads them.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from agent_runtime.crypto import decode_key
from agent_runtime.db import check_schema_name
from agent_runtime.errors import ConfigError
from agent_runtime.mcp.config import servers_from_env

__all__ = ["ENVIRONMENT", "HostConfig", "RetainedRelease"]

# (name, default, meaning): the host's whole configuration surface.
# The variables that describe effect providers, passed as given to `effects.config.adapters_from_env`.
EFFECT_VARIABLES = ("AGENT_EFFECTS", "AGENT_SMTP_URL", "AGENT_SMTP_IMAP_LOOKUP_URL", "AGENT_SMTP_IMAP_LOOKUP_WINDOW_S",
                    "AGENT_PAYMENTS_URL", "AGENT_PAYMENTS_LOOKUP_CONSISTENCY_S")

ENVIRONMENT: tuple[tuple[str, str, str], ...] = (
    ("AGENT_TENANT_ID", "(required)", "the tenant's UUID; binds encryption and effect keys to the tenant"),
    ("AGENT_SCHEMA", "(required)", "the tenant's PostgreSQL schema"),
    ("AGENT_DATABASE_URL", "(required)", "DSN of the tenant's own login role"),
    ("AGENT_VOLUME", "(required)", "the instance's volume (working files under workspace/)"),
    ("AGENT_OBJECTSTORE_URL", "(required)", "file:///... or s3://bucket/prefix/ of the tenant's prefix"),
    ("AGENT_OBJECT_KEY", "(required)", "base64 32-byte key for client-side object encryption"),
    ("AGENT_OBJECT_KEYS_PREVIOUS", "", "older object keys (comma-separated), to read objects after a rotation"),
    ("AGENT_APP", "", "module:attribute naming the agent(s) to run instead of installed entry points"),
    ("AGENT_KINDS", "all installed", "comma-separated agent kinds this instance serves; only the entry points named "
                                     "after them are imported (the control plane sets it to its release's declared "
                                     "kinds)"),
    ("AGENT_RELEASE_PATH", "", "install directory of the operator's release to run: only its distributions' entry "
                               "points are loaded, not the runtime environment's"),
    ("AGENT_RELEASE_VERSION", "", "that release's version (in the boot event and /readyz)"),
    ("AGENT_RELEASE_DIGEST", "", "that release's digest, sha256:<hex> (in the boot event and /readyz); alone, "
                                 "without AGENT_RELEASE_PATH: the image the instance runs is that release"),
    ("AGENT_RELEASES_RETAINED", "[]", "JSON list of earlier releases ({version, digest, path}) the instance keeps "
                                      "loadable: a task started on one of them finishes on it (docs/sdk.md)"),
    ("AGENT_CONFIG", "{}", "JSON object handed to agents as ctx.config when no control plane is set (with one, "
                           "each task asks it)"),
    ("AGENT_EFFECTS", "{}", "JSON: effect name -> provider (type http|smtp|webhook and options; docs/sdk.md)"),
    ("AGENT_SMTP_URL", "", "shortcut: effect 'email' through this SMTP relay"),
    ("AGENT_SMTP_IMAP_LOOKUP_URL", "", "imap[s]://user:credential-name@host:port/MAILBOX: an 'email' in doubt is "
                                       "looked up by Message-ID in that folder (Sent by default) instead of a human"),
    ("AGENT_SMTP_IMAP_LOOKUP_WINDOW_S", "60", "how long after a send that folder may still miss it: 'absent' is "
                                              "trusted only after that"),
    ("AGENT_PAYMENTS_URL", "", "shortcut: effect 'payment' on a Stripe-style charges API at this base URL"),
    ("AGENT_PAYMENTS_LOOKUP_CONSISTENCY_S", "60", "how long after a charge attempt that API's search may still miss "
                                                  "it: 'absent' is trusted only after that"),
    ("AGENT_MCP_SERVERS", "{}", "JSON: MCP server name -> {url, credential (a name), trust_annotations, timeout_s, "
                                "tools: per-tool kind read_only|idempotent|effect} (docs/sdk.md, \"MCP tools\")"),
    ("AGENT_CONTROL_PLANE_URL", "", "control plane's internal URL (heartbeats, credentials)"),
    ("AGENT_INSTANCE_TOKEN", "", "this instance's token for the control plane's internal API"),
    ("AGENT_CREDENTIAL_<NAME>", "", "a credential from the environment when no control plane is configured"),
    ("AGENT_NET_FORWARDS", "", "<port>=<unix socket>,...: in a network namespace of its own, listen on "
                               "127.0.0.1:<port> and forward to that granted socket (set by the control plane)"),
    ("AGENT_HTTP_HOST", "127.0.0.1", "address of /healthz, /readyz and the instance API (/v1/)"),
    ("AGENT_HTTP_PORT", "0", "port of the same (0: any; written to <volume>/.host/http-port)"),
    ("AGENT_CHAT_KIND", "the conversational agent", "the agent kind that answers messages (docs/instance-api.md)"),
    ("AGENT_MESSAGE_MAX_CHARS", "32000", "longest message the instance API accepts"),
    ("AGENT_API_MAX_BODY", "1048576", "largest instance API request body, in bytes"),
    ("AGENT_STREAM_MAX_S", "300", "longest server-sent event stream before it ends with 'timeout'"),
    ("AGENT_HTTP_KEEPALIVE_S", "30", "how long a kept-alive HTTP/1.1 connection waits for its next request (0: "
                                     "one request per connection)"),
    ("AGENT_LOG_FILE", "", "the instance's log file, read by GET /v1/logs (else an in-memory ring)"),
    ("AGENT_HEARTBEAT_INTERVAL_S", "2.0", "seconds between heartbeats (and database probes, lease renewals)"),
    ("AGENT_DATABASE_POOLED", "0", "1: the DSN goes through a transaction-pooling proxy (PgBouncer): no session "
                                   "lock, the lease alone decides the single writer"),
    ("AGENT_LEASE_TTL_S", "15.0", "single-writer lease: how long a silent host keeps it"),
    ("AGENT_STEP_TIMEOUT_S", "30.0", "a step without progress for longer is reported stuck on /healthz"),
    ("AGENT_STEP_MAX_ATTEMPTS", "3", "attempts of a step (errors, crashes, hangs) before its task is blocked "
                                     "(per step: max_attempts)"),
    ("AGENT_EFFECT_RETRY_MAX_S", "30.0", "longest wait between lookups of an effect in doubt"),
    ("AGENT_GRACE_PERIOD_S", "10.0", "SIGTERM: how long the current step may take to finish"),
    ("AGENT_POLL_INTERVAL_S", "0.2", "how often an idle worker looks for new tasks through a pooler (direct "
                                     "connections: woken by LISTEN, it looks every heartbeat interval)"),
    ("AGENT_CHECKPOINT_INTERVAL_S", "5.0", "timer checkpoints inside long steps (ctx.progress)"),
    ("AGENT_CHECKPOINT_KEEP", "5", "checkpoints kept per task"),
    ("AGENT_MEMORY_TOKEN_BUDGET", "4000", "token budget of the conversation window read back at boot"),
    ("AGENT_ON_WORKSPACE_MISMATCH", "refuse", "refuse | fork: a workspace that differs from its checkpoint"),
    ("AGENT_EMBEDDER", "hash", "semantic memory embedder: hash | minilm | openai:<url>|<model>"),
    ("AGENT_TRACE_SPANS_PER_TASK", "500", "spans kept per task in the schema (runs and steps first; "
                                          "docs/observability.md)"),
    ("AGENT_TRACE_KEEP_DAYS", "30", "spans older than this are deleted after task runs"),
    ("AGENT_TRACE_CONTENT", "1", "0: spans carry no inputs/outputs (arguments, results, messages), only timings, "
                                 "names and token counts"),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "", "OTLP/HTTP collector base URL: spans are also exported to "
                                        "<url>/v1/traces (the standard OTEL_EXPORTER_OTLP_* variables apply)"),
)


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


def _json_object(env: Mapping[str, str], name: str) -> dict[str, object]:
    raw = env.get(name, "")
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"{name} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ConfigError(f"{name} must be a JSON object")
    return value


def _mcp_servers(env: Mapping[str, str]) -> str:
    raw = env.get("AGENT_MCP_SERVERS", "")
    servers_from_env(raw)  # refused at start, naming the field, rather than at a task's first call
    return raw


@dataclass(frozen=True)
class RetainedRelease:
    """An earlier release the instance can still load, for the tasks that started on it. An empty digest (and no
    path) is the runtime environment's own agents: what an instance ran before its operator's first release."""

    version: str
    digest: str
    path: Path | None


def _retained(env: Mapping[str, str]) -> tuple[RetainedRelease, ...]:
    raw = env.get("AGENT_RELEASES_RETAINED", "")
    if not raw:
        return ()
    try:
        items = json.loads(raw)
        out = tuple(RetainedRelease(str(i["version"]), str(i["digest"]), Path(str(i["path"])) if i["path"] else None)
                    for i in items)
    except (ValueError, TypeError, KeyError) as exc:
        raise ConfigError("AGENT_RELEASES_RETAINED must be a JSON list of {version, digest, path} objects") from exc
    for release in out:
        runtime_agents = not release.digest and release.path is None
        if not runtime_agents and not (release.digest.startswith("sha256:") and release.path is not None
                                       and release.path.is_absolute()):
            raise ConfigError(f"AGENT_RELEASES_RETAINED: release {release.version!r} needs a sha256: digest and an "
                              "absolute path (or neither: the runtime's own agents)")
    return out


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
    net_forwards: str = ""
    instance_token: str | None = field(default=None, repr=False)
    heartbeat_interval_s: float = 2.0
    step_timeout_s: float = 30.0
    grace_period_s: float = 10.0
    poll_interval_s: float = 0.2
    checkpoint_interval_s: float = 5.0
    checkpoint_keep_latest: int = 5
    step_max_attempts: int = 3
    trace_spans_per_task: int = 500
    trace_keep_days: float = 30.0
    memory_token_budget: int = 4000
    on_workspace_mismatch: str = "refuse"  # or "fork"
    agent_app: str | None = None
    agent_kinds: tuple[str, ...] = ()
    # The operator's release this instance runs (its install directory); None: the runtime environment's agents.
    release_path: Path | None = None
    release_version: str = ""
    release_digest: str = ""
    # Earlier releases kept loadable for the tasks that started on them (``host.release_policy``).
    retained_releases: tuple[RetainedRelease, ...] = ()
    agent_config: dict[str, object] = field(default_factory=dict)
    # The effect variables as given (AGENT_EFFECTS / AGENT_SMTP_URL / AGENT_PAYMENTS_URL), built into adapters
    # by the host once its credential source exists.
    effects_env: dict[str, str] = field(default_factory=dict, repr=False)
    # AGENT_MCP_SERVERS as given (checked by `from_env`, built into specs by the host).
    mcp_servers_env: str = ""
    effect_retry_max_s: float = 30.0
    database_pooled: bool = False
    lease_ttl_s: float = 15.0
    embedder: str = "hash"
    chat_kind: str | None = None
    message_max_chars: int = 32000
    api_max_body: int = 1 << 20
    # How long a kept-alive connection of the control plane may wait for its next request (its pool lets go of
    # one sooner: instances.client.KEEPALIVE_IDLE_S). 0: one request per connection, as HTTP/1.0.
    http_keepalive_s: float = 30.0
    stream_max_s: float = 300.0
    log_file: Path | None = None

    @property
    def release(self) -> dict[str, str] | None:
        """Which release the instance runs, as the control plane verifies it (boot event, /readyz); None: none.

        A wheel release comes with its directory (``AGENT_RELEASE_PATH``); an image release is the image itself,
        its agents the installed ones, so its version and digest alone name it."""
        if self.release_path is None and not self.release_digest:
            return None
        return {"version": self.release_version, "digest": self.release_digest}

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
            net_forwards=env.get("AGENT_NET_FORWARDS", ""),
            instance_token=env.get("AGENT_INSTANCE_TOKEN") or None,
            heartbeat_interval_s=_float(env, "AGENT_HEARTBEAT_INTERVAL_S", 2.0),
            step_timeout_s=_float(env, "AGENT_STEP_TIMEOUT_S", 30.0),
            grace_period_s=_float(env, "AGENT_GRACE_PERIOD_S", 10.0),
            poll_interval_s=_float(env, "AGENT_POLL_INTERVAL_S", 0.2),
            checkpoint_interval_s=_float(env, "AGENT_CHECKPOINT_INTERVAL_S", 5.0),
            checkpoint_keep_latest=int(env.get("AGENT_CHECKPOINT_KEEP", "5")),
            step_max_attempts=int(env.get("AGENT_STEP_MAX_ATTEMPTS", "3")),
            trace_spans_per_task=max(1, int(env.get("AGENT_TRACE_SPANS_PER_TASK", "500"))),
            trace_keep_days=_float(env, "AGENT_TRACE_KEEP_DAYS", 30.0),
            memory_token_budget=int(env.get("AGENT_MEMORY_TOKEN_BUDGET", "4000")),
            on_workspace_mismatch=mismatch,
            agent_app=env.get("AGENT_APP") or None,
            agent_kinds=tuple(k.strip() for k in env.get("AGENT_KINDS", "").split(",") if k.strip()),
            release_path=Path(env["AGENT_RELEASE_PATH"]) if env.get("AGENT_RELEASE_PATH") else None,
            release_version=env.get("AGENT_RELEASE_VERSION", ""),
            release_digest=env.get("AGENT_RELEASE_DIGEST", ""),
            retained_releases=_retained(env),
            agent_config=_json_object(env, "AGENT_CONFIG"),
            effects_env={k: env[k] for k in EFFECT_VARIABLES if env.get(k)},
            mcp_servers_env=_mcp_servers(env),
            effect_retry_max_s=_float(env, "AGENT_EFFECT_RETRY_MAX_S", 30.0),
            database_pooled=env.get("AGENT_DATABASE_POOLED", "0") in ("1", "true", "yes"),
            lease_ttl_s=_float(env, "AGENT_LEASE_TTL_S", 15.0),
            embedder=env.get("AGENT_EMBEDDER", "hash"),
            chat_kind=env.get("AGENT_CHAT_KIND") or None,
            message_max_chars=int(env.get("AGENT_MESSAGE_MAX_CHARS", "32000")),
            api_max_body=int(env.get("AGENT_API_MAX_BODY", str(1 << 20))),
            http_keepalive_s=_float(env, "AGENT_HTTP_KEEPALIVE_S", 30.0),
            stream_max_s=_float(env, "AGENT_STREAM_MAX_S", 300.0),
            log_file=Path(env["AGENT_LOG_FILE"]) if env.get("AGENT_LOG_FILE") else None,
        )
