"""Every environment variable the control plane reads, declared once: name, type, default, meaning, production rule.

``settings.py`` reads each of them through ``Setting.read`` (django-environ does the parsing), so a variable that is
not declared here cannot be read there; ``manage.py settings`` prints this table and ``manage.py settings
--markdown`` renders the README's configuration section, which a test compares with it (an undocumented setting
fails the build). The data plane does the same in ``agent_runtime/host/config.py`` (``agent-host --help``).

Pure data and pure functions: no Django import, no I/O, so it can be read before Django is configured.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, Protocol

__all__ = ["COMPUTED", "FAULT_INJECTION_SWITCH", "SETTINGS", "Production", "Setting", "fault_knobs",
           "fault_injection_problems", "loopback_grant_problem", "markdown_table"]


class _Computed:
    """The default of a setting ``settings.py`` derives from others (the var/ directory, DEBUG, TLS...)."""

    def __repr__(self) -> str:
        return "COMPUTED"


COMPUTED: Final = _Computed()


class Production(StrEnum):
    """What a production configuration (``DJANGO_ENV=production``) may do with a setting."""

    YES = "yes"
    REQUIRED = "required"  # production_settings_problems refuses to start without it
    OFF = "must be off"  # refused when on (development and test overrides)
    TEST_ONLY = "never (tests)"  # fault injection: refused when set at all


class _Env(Protocol):
    """The part of ``environ.Env`` used here (kept as a protocol: no django-environ import at module level)."""

    def str(self, var: builtins.str, default: Any = ...) -> Any: ...
    def bool(self, var: builtins.str, default: Any = ...) -> Any: ...
    def int(self, var: builtins.str, default: Any = ...) -> Any: ...
    def float(self, var: builtins.str, default: Any = ...) -> Any: ...
    def list(self, var: builtins.str, cast: Any = ..., default: Any = ...) -> Any: ...
    def dict(self, var: builtins.str, cast: Any = ..., default: Any = ...) -> Any: ...
    def json(self, var: builtins.str, default: Any = ...) -> Any: ...


# Types as django-environ parses them; "url" values are strings settings.py hands to env.db_url / env.email_url.
_READERS: Final = {
    "str": lambda env, name, default: env.str(name, default=default),
    "url": lambda env, name, default: env.str(name, default=default),
    "path": lambda env, name, default: env.str(name, default=default),
    "bool": lambda env, name, default: env.bool(name, default=default),
    "int": lambda env, name, default: env.int(name, default=default),
    "float": lambda env, name, default: env.float(name, default=default),
    "list": lambda env, name, default: env.list(name, default=default),
    "list[int]": lambda env, name, default: env.list(name, cast=int, default=default),
    "list[float]": lambda env, name, default: env.list(name, cast=float, default=default),
    "dict": lambda env, name, default: env.dict(name, default=default),
    "json": lambda env, name, default: env.json(name, default=default),
}


@dataclass(frozen=True)
class Setting:
    """One environment variable. ``shown`` replaces the default in the docs where the raw value says too little."""

    name: str
    type: str
    default: Any
    doc: str
    section: str
    production: Production = Production.YES
    shown: str = ""

    def __post_init__(self) -> None:
        if self.type not in _READERS:
            raise ValueError(f"{self.name}: unknown type {self.type!r}")
        if self.default is COMPUTED and not self.shown:
            raise ValueError(f"{self.name}: a computed default needs `shown`")

    def read(self, env: _Env, default: Any = COMPUTED) -> Any:
        """The value from ``env``; ``default`` is required for (and only for) a computed default."""
        if (default is COMPUTED) != (self.default is not COMPUTED):
            raise TypeError(f"{self.name}: pass a default exactly when the declared one is computed")
        return _READERS[self.type](env, self.name, self.default if default is COMPUTED else default)

    @property
    def shown_default(self) -> str:
        if self.shown:
            return self.shown
        if self.default in ("", [], {}):
            return "empty"
        if isinstance(self.default, bool):
            return str(self.default).lower()
        if isinstance(self.default, list):
            return ",".join(str(v) for v in self.default)
        if isinstance(self.default, dict):
            return ",".join(f"{k}={v}" for k, v in self.default.items())
        return str(self.default)


FAULT_INJECTION_SWITCH: Final = "CONTROLPLANE_FAULT_INJECTION"

_Y, _REQ, _OFF, _TEST = Production.YES, Production.REQUIRED, Production.OFF, Production.TEST_ONLY

_TABLE: tuple[tuple[str, tuple[tuple[Any, ...], ...]], ...] = (
    ("Core", (
        ("CONTROLPLANE_VAR_DIR", "path", COMPUTED, "where the embedded default keeps everything: PostgreSQL, Redis, "
         "secrets, logs, volumes, pid files; `make run`/`make stop`/`make clean` act on this one", _Y,
         "`var/` in the checkout"),
        ("DJANGO_ENV", "str", "development", "`production`: HTTPS-only cookies, HSTS, redirect; refuses development "
         "secrets, the embedded services and every test-only setting ([security](docs/security.md))"),
        ("DEBUG", "bool", False, "Django's debug mode (refused in production)", _OFF),
        ("SECRET_KEY", "str", "", "Django secret key", _REQ, "generated once into `var/secrets`"),
        ("ALLOWED_HOSTS", "list", ["localhost", "127.0.0.1", "[::1]", "testserver"],
         "host names served (portal hosts are added from `PORTAL_ALLOWED_HOSTS`)", _REQ),
        ("LOG_LEVEL", "str", "INFO", "level of the root logger (console)"),
    )),
    ("Database", (
        ("DATABASE_URL", "url", "", "control-plane database; tenant schemas live there too unless "
         "`TENANT_DATABASE_URL` is set. The embedded server asks every role for its password (SCRAM; the "
         "superuser's is generated once into `var/secrets/postgres-superuser-password`) and listens on its socket "
         "and on `127.0.0.1:<port>` (picked once, kept in `var/pgdata/controlplane.conf`)", _REQ,
         "embedded PostgreSQL in `var/pgdata`"),
        ("DB_CONN_MAX_AGE", "int", 0, "seconds a web thread keeps its database connection (gunicorn's threads; keep "
         "0 under `runserver`)", _Y, "0 (the image: 60)"),
        ("TENANT_DATABASE_URL", "url", "", "where tenant schemas and roles are created; each tenant role may connect "
         "to this database only (PUBLIC has no CONNECT or TEMP on it)", _Y,
         "embedded default: database `tenants` on the embedded server (over 127.0.0.1); otherwise the control "
         "plane's own database"),
        ("TENANT_DATABASE_POOLER_URL", "url", "", "a PgBouncer in transaction mode in front of that server (host, "
         "port, database; no user or password): instances on it connect through the pooler and hold no idle "
         "session (docs/production.md, \"Pooled connections\")"),
        ("EMBEDDED_PGBOUNCER", "bool", False, "on the embedded default, start (or reuse) a PgBouncer in front of its "
         "tenant database and pool every instance through it (docs/production.md, \"The embedded default's "
         "PgBouncer\")", _Y, "`false`; `make demo`/`make run`: `true` where `pgbouncer` is installed"),
        ("TENANT_DATABASE_ALLOW_INSECURE_AUTH", "bool", False, "provision even when the tenant server's "
         "`pg_hba.conf` lets a tenant role in without its password (`trust`); recorded on the database resource as "
         "`\"auth\": \"insecure-override\"`. For test servers only (the test suite sets it)", _OFF),
        ("TENANT_NAME_PREFIX", "str", "t_", "prefix of every tenant schema and role name (names are derived from "
         "the tenant id, never from input)"),
    )),
    ("Broker and cache", (
        ("CELERY_BROKER_URL", "url", "", "e.g. `redis://:<password>@127.0.0.1:6379/0`", _REQ,
         "embedded Redis in `var/redis` (unix socket only, password generated once into `var/secrets/redis-password`;"
         " started by the first process that needs it, stopped by `make stop`)"),
        ("CELERY_VISIBILITY_TIMEOUT_S", "int", 120, "unacked messages of a worker that died are redelivered after "
         "this long (Redis transport), found by a restore sweep every min(10 s, half of it)"),
        ("CELERY_TASK_DEFAULT_QUEUE", "str", "controlplane", "the Celery queue every task goes to"),
        ("CACHE_URL", "url", "", "throttle counters (rates: `THROTTLE_*_RATE`)", _Y,
         "the broker's Redis (the embedded one by default), else local memory"),
        ("CACHE_KEY_PREFIX", "str", "cp", "prefix of every cache key in that Redis"),
    )),
    ("API", (
        ("DATA_UPLOAD_MAX_MEMORY_SIZE", "int", 256 * 1024, "largest request body in bytes, refused before parsing "
         "(400 problem+json)"),
        ("DATA_UPLOAD_MAX_NUMBER_FIELDS", "int", 200, "most form fields a request may carry"),
        ("FILE_UPLOAD_MAX_MEMORY_SIZE", "int", 2_621_440, "multipart parts above this many bytes are spooled to a "
         "temporary file, never held in memory"),
        ("THROTTLE_ONBOARDING_RATE", "str", "60/min", "`POST /api/v1/tenants`, per operator (the tenant quota still "
         "caps the total)"),
        ("THROTTLE_CREDENTIALS_RATE", "str", "300/min", "operator credential API (list, read, put, revoke), per "
         "operator"),
        ("THROTTLE_OPERATOR_RATE", "str", "1200/min", "every other operator API call, per operator"),
        ("THROTTLE_INSTANCE_CREDENTIALS_RATE", "str", "600/min", "instance credential and object-key delivery, per "
         "instance"),
        ("CORS_ALLOWED_ORIGINS", "list", [], "origins, besides the operators' own domains, whose browsers may call "
         "the customer-token endpoints"),
    )),
    ("Provisioning", (
        ("PROVISIONING_PROFILE", "str", "local", "driver set: `local` (schema + role, 0700 directory, filesystem "
         "object store, `agent-host` subprocess) or `kubernetes` (docs/production.md)"),
        ("PROVISIONING_RUNTIME_DRIVER", "str", "", "`deferred`: provision everything but start no instance (bulk "
         "pre-provisioning, benchmarks)", _Y, "the profile's"),
        ("LOCAL_VOLUME_ROOT", "path", COMPUTED, "local profile: where instance volumes are created", _Y,
         "`var/volumes`"),
        ("LOCAL_OBJECTSTORE_ROOT", "path", COMPUTED, "local profile: the filesystem object store (and the control "
         "plane's own objects with `CONTROLPLANE_OBJECTSTORE=local`)", _Y, "`var/objectstore`"),
        ("CONTROLPLANE_OBJECTSTORE", "str", "local", "where the control plane keeps what every machine of it must "
         "see (release wheels, by digest): `local` (`LOCAL_OBJECTSTORE_ROOT/controlplane/`, one machine) or `s3` "
         "(`S3_BUCKET`, prefix `controlplane/`); production refuses `local` "
         "([production](docs/production.md#what-lives-where))"),
        ("LOCAL_INSTANCE_ISOLATION", "str", "auto", "`auto`: each local instance runs as its own system user in a "
         "bubblewrap sandbox where the control plane runs as root with `bwrap`, and is marked `isolation: degraded` "
         "elsewhere; `required`: refuse to start an instance that cannot be sandboxed (always so in production); "
         "`off`: never sandbox (refused in production). See "
         "[docs/operations.md](docs/operations.md#instance-isolation-local-profile)"),
        ("LOCAL_INSTANCE_NETWORK", "str", "auto", "local profile, sandboxed instances: `isolated`: each instance "
         "gets a network namespace of its own (only its loopback) and reaches exactly its database, the internal "
         "API, its S3 endpoint, the egress proxy (`EGRESS_PROXY_ADDRESS`; none without it) and "
         "`LOCAL_INSTANCE_LOOPBACK_GRANTS` through unix sockets the driver binds into it (`socat` outside); "
         "`shared`: the sandbox keeps the machine's network namespace (every loopback service is reachable, guarded "
         "by its own authentication); `auto`: `isolated` wherever instances are sandboxed (root, `bwrap`) and `socat` "
         "is installed, else `shared` with the posture's `network` line saying why "
         "([docs/security.md](docs/security.md))"),
        ("LOCAL_INSTANCE_LAUNCH", "str", "exec", "local profile, sandboxed instances: `exec`: each instance is its "
         "own `python -m agent_runtime.host` (~33 MiB private memory idle); `fork`: forked from one pre-imported, "
         "tenant-free fork server per machine into the same sandbox (~14 MiB private memory idle, the rest shared; "
         "every instance shares the "
         "server's address-space layout) ([docs/security.md](docs/security.md#forked-instances))"),
        ("LOCAL_INSTANCE_LOOPBACK_GRANTS", "list", [], "development only: loopback `ip:port` destinations "
         "(`127.0.0.1:8026,...`) every isolated instance is granted as one more relay, reached inside at "
         "`127.0.0.1:<port>`; `make run`/`make demo` grant their local peers (payments, SMTP sink, chat model, OAuth, "
         "MCP). Anything else, and every address in production, goes through the egress proxy, which refuses "
         "private ones ([security](docs/security.md#egress))", _OFF),
        ("LOCAL_INSTANCE_CGROUP_PARENT", "str", "", "local profile, sandboxed instances: the cgroup (a path below "
         "each controller's mount, e.g. a systemd slice delegated to the control plane) under which each instance "
         "gets `agent-instances/<name>` with its plan's memory, pids and CPU limits; empty: the control plane's own "
         "cgroup"),
        ("LOCAL_VOLUME_QUOTA", "str", "auto", "local profile, sandboxed instances: `auto` makes each new volume an "
         "ext4 image of its plan's storage, loop-mounted at its path (writes past it: ENOSPC for that tenant only) "
         "where the control plane can loop-mount (root, `mkfs.ext4`, loop devices), else plain directories with the "
         "posture's `disk quota` line saying why; `off`: plain directories sharing the disk. `make clean` unmounts "
         "the images"),
        ("LOCAL_INSTANCE_UID_BASE", "int", 2**20, "local profile, sandboxed instances: the first of the numeric uids "
         "(and gids) given to instances, one per tenant, never reused; above every system and login user"),
        ("SCHEMA_ARCHIVE_RETENTION_DAYS", "int", 30, "days an offboarded tenant's schema archive is kept"),
        ("WORKFLOW_STEP_MAX_ATTEMPTS", "int", 5, "attempts of a provisioning step before its run fails"),
        ("WORKFLOW_RETRY_BACKOFF_S", "float", 2.0, "first wait between a step's attempts (doubles each time)"),
        ("WORKFLOW_STALL_AFTER_S", "float", 30.0, "a workflow run or rolling restart that has not moved for this "
         "long is re-queued by the jobs sweep (overrides `JOBS_STALL_AFTER_S`)"),
        ("JOBS_STALL_AFTER_S", "float", 60.0, "a resumable job (controlplane/jobs) that has not moved for this long is "
         "queued again by the one stall sweep; a kind may override it with its own setting (the `*_STALL_AFTER_S` "
         "below)"),
        ("RUNTIME_READY_TIMEOUT_S", "float", 30.0, "how long a started local instance may take to answer /readyz"),
    )),
    ("Instances", (
        ("CONTROL_PLANE_INTERNAL_URL", "str", "", "base URL instances use for heartbeats and credential delivery"),
        ("RUNTIME_STOP_GRACE_S", "float", 20.0, "how long a stopping instance may take after SIGTERM"),
        ("INSTANCE_IDLE_SUSPEND_S", "float", 900.0, "scale to zero: an instance with no activity for this long is "
         "stopped cleanly and marked asleep; the next message or task wakes it. 0 turns sleeping off"),
        ("INSTANCE_EXTRA_ENV", "str", "", "extra `AGENT_*` settings for every instance: `K=V,K=V` or a JSON object "
         "(for values with commas, e.g. `AGENT_CONFIG`)", _Y,
         "empty; `make run`/`make demo`: the local peers' addresses (a value you set is replaced)"),
        ("INSTANCE_OTLP_ENDPOINT", "str", "", "OTLP/HTTP collector base URL (any collector, Langfuse, Jaeger) handed "
         "to every instance as `OTEL_EXPORTER_OTLP_ENDPOINT`: each task's spans are exported to `<url>/v1/traces` "
         "too (docs/observability.md); empty: kept in the tenant's schema only"),
    )),
    ("Recovery and health", (
        ("HEARTBEAT_REDIS_URL", "url", COMPUTED, "where instance heartbeats go (PostgreSQL when there is no Redis)",
         _Y, "the broker's Redis"),
        ("HEARTBEAT_KEY_PREFIX", "str", "cp:hb", "prefix of the heartbeat keys in that Redis"),
        ("HEARTBEAT_TIMEOUT_S", "float", 10.0, "an instance without a heartbeat for this long is dead"),
        ("PROGRESS_STALL_TIMEOUT_S", "float", 60.0, "an instance whose step in flight has not moved for this long "
         "is hung"),
        ("SERVICE_HEARTBEAT_INTERVAL_S", "float", 2.0, "how often the Celery worker and beat write their liveness "
         "heartbeat ([operations](docs/operations.md))"),
        ("SERVICE_HEARTBEAT_TIMEOUT_S", "float", 10.0, "after how long without one `/readyz` and the dashboard call "
         "that service down"),
        ("RECOVERY_SWEEP_INTERVAL_S", "float", 5.0, "how often beat's recovery sweep looks for dead and hung "
         "instances; applied to the beat schedule at the next `migrate` "
         "([operations](docs/operations.md#periodic-jobs))"),
        ("LEADER_LEASE_S", "float", 15.0, "the leader lease of beat and the instance watcher (several may run, one "
         "leads): a leader that stopped renewing is replaced after at most this long, by the database's clock "
         "([production](docs/production.md#several-machines-beat-and-the-watchers))"),
        ("LEADER_RENEW_S", "float", 2.0, "how often the leader renews its lease and a standby tries to take it (under "
         "half of `LEADER_LEASE_S`)"),
        ("LOCAL_EXIT_NOTICE", "bool", True, "the process that starts a local instance starts its recovery the "
         "moment it exits (the heartbeat timeout remains for hangs)"),
        ("RECOVERY_BACKOFF_BASE_S", "float", 10.0, "first wait before recovering an instance again (doubles)"),
        ("RECOVERY_MAX_FAILURES", "int", 3, "recoveries within the window after which an instance is failed"),
        ("RECOVERY_FAILURE_WINDOW_S", "float", 900.0, "the window of `RECOVERY_MAX_FAILURES`"),
        ("RECOVERY_STOP_GRACE_S", "float", 5.0, "how long a dead instance may take to stop before recovery"),
        ("RECOVERY_HUNG_STOP_GRACE_S", "float", 1.0, "the same for a hung instance (it does not act on SIGTERM)"),
        ("RECOVERY_VERIFY_TIMEOUT_S", "float", 60.0, "how long a recovered instance may take to come back ready"),
        ("ROLLING_RESTART_CONCURRENCY", "int", 1, "instances a rolling restart restarts at once"),
        ("SCHEMA_BACKUP_INTERVAL_S", "float", 6 * 3600, "how often each tenant's schema is backed up"),
        ("METRICS_TOKEN", "str", "", "bearer token a Prometheus scraper presents at `/metrics`; empty: staff "
         "sessions only"),
    )),
    ("Vault", (
        ("VAULT_KEK_PROVIDER", "str", "local", "key-encryption keys: `local` (`VAULT_KEK_KEYRING`) or `aws-kms` "
         "(`VAULT_KMS_KEY_ID`)"),
        ("VAULT_KEK_KEYRING", "str", "", "`v1:<base64 32 bytes>,v2:...` (newest wraps); required in production with "
         "the local provider", _Y, "generated once into `var/secrets` "
         "([why once](docs/vault.md#the-development-key-ring-created-once-never-forked))"),
        ("VAULT_KMS_KEY_ID", "str", "", "the KMS key of the `aws-kms` provider"),
        ("VAULT_KMS_REGION", "str", "", "region of the `aws-kms` provider", _Y, "boto3's usual resolution"),
        ("AWS_ENDPOINT_URL", "str", "", "endpoint of the KMS API (a local stand-in in tests)", _Y, "AWS's"),
        ("VAULT_ROTATION_STALL_AFTER_S", "float", 60.0, "an unfinished rotation job that has not moved for this long "
         "is queued again by the jobs sweep (overrides `JOBS_STALL_AFTER_S`)"),
        ("VAULT_SHRED_GRACE_S", "float", 86400.0, "a retired data key is destroyed no sooner than this after "
         "retirement (crypto-shredding, docs/vault.md)"),
    )),
    ("Kubernetes profile", (
        ("KUBERNETES_IN_CLUSTER", "bool", False, "use the in-cluster service account"),
        ("KUBERNETES_KUBECONFIG", "str", "", "kubeconfig file when not in cluster", _Y, "`~/.kube/config`"),
        ("KUBERNETES_CONTEXT", "str", "", "context in that file", _Y, "its current one"),
        ("KUBERNETES_FIELD_MANAGER", "str", "agent-control-plane", "server-side apply field manager"),
        ("KUBERNETES_REQUEST_TIMEOUT_S", "float", 30.0, "timeout of one API request"),
        ("KUBERNETES_NAMESPACE_PREFIX", "str", "tenant-", "tenant namespace = prefix + DNS-1123 form of the tenant's "
         "resource name"),
        ("KUBERNETES_AGENT_IMAGE", "str", "ghcr.io/example/agent-host:0.1.0", "image of every instance"),
        ("KUBERNETES_IMAGE_PULL_POLICY", "str", "IfNotPresent", "its pull policy"),
        ("KUBERNETES_IMAGE_PULL_SECRET", "str", "", "its pull secret"),
        ("KUBERNETES_STORAGE_CLASS", "str", "", "storage class of the instance volume", _Y, "the cluster's default"),
        ("KUBERNETES_VOLUME_ACCESS_MODE", "str", "ReadWriteOnce", "`ReadWriteOncePod` (CSI, Kubernetes >= 1.29) lets "
         "the volume itself refuse a second writer"),
        ("KUBERNETES_VOLUME_MOUNT_PATH", "str", "/data", "where the volume is mounted in the pod"),
        ("KUBERNETES_AGENT_UID", "int", 10001, "non-root UID of the instance container"),
        ("KUBERNETES_AGENT_GRACE_PERIOD_S", "int", 45, "the host's `AGENT_GRACE_PERIOD_S` in the pod"),
        ("KUBERNETES_FLUSH_MARGIN_S", "int", 15, "added to it for `terminationGracePeriodSeconds`, so the kubelet "
         "never kills a clean flush"),
        ("KUBERNETES_READY_TIMEOUT_S", "float", 300.0, "how long a StatefulSet may take to report a ready replica"),
        ("KUBERNETES_READY_POLL_S", "float", 2.0, "how often it is asked"),
        ("KUBERNETES_NAMESPACE_DELETE_TIMEOUT_S", "float", 300.0, "how long a namespace deletion may take"),
        ("KUBERNETES_CONTROL_PLANE_NAMESPACE", "str", "agent-control-plane", "NetworkPolicy: the control plane's "
         "namespace"),
        ("KUBERNETES_CONTROL_PLANE_POD_LABELS", "dict", {"app.kubernetes.io/name": "agent-control-plane"},
         "NetworkPolicy: the control plane's pod labels"),
        ("KUBERNETES_CONTROL_PLANE_PORT", "int", 8000, "NetworkPolicy: the control plane's port"),
        ("KUBERNETES_DNS_NAMESPACE", "str", "kube-system", "NetworkPolicy: the DNS namespace"),
        ("KUBERNETES_DNS_POD_LABELS", "dict", {"k8s-app": "kube-dns"}, "NetworkPolicy: the DNS pod labels"),
        ("KUBERNETES_POSTGRES_CIDRS", "list", [], "NetworkPolicy: PostgreSQL by CIDR"),
        ("KUBERNETES_POSTGRES_NAMESPACE", "str", "", "NetworkPolicy: PostgreSQL by namespace"),
        ("KUBERNETES_POSTGRES_PORT", "int", 5432, "NetworkPolicy: PostgreSQL's port"),
        ("KUBERNETES_OBJECTSTORE_CIDRS", "list", [], "NetworkPolicy: the object store by CIDR"),
        ("KUBERNETES_OBJECTSTORE_NAMESPACE", "str", "", "NetworkPolicy: the object store by namespace"),
        ("KUBERNETES_OBJECTSTORE_PORTS", "list[int]", [443], "NetworkPolicy: the object store's ports"),
        ("KUBERNETES_PLANS_JSON", "json", {}, "`{\"plan\": {...}}` overriding the plans' quotas and resources"),
    )),
    ("S3 object store", (
        ("S3_BUCKET", "str", "", "the one bucket (prefix `tenants/<tenant-id>/` per tenant)"),
        ("S3_REGION", "str", "us-east-1", "its region"),
        ("S3_ENDPOINT_URL", "str", "", "any S3-compatible endpoint", _Y, "AWS's"),
        ("S3_INSTANCE_ENDPOINT_URL", "str", "", "the endpoint as instances reach it", _Y, "`S3_ENDPOINT_URL`"),
        ("S3_CREATE_BUCKET", "bool", False, "create the bucket when missing"),
        ("S3_ACCESS_KEY_ID", "str", "", "control-plane credentials", _Y, "boto3's default chain"),
        ("S3_SECRET_ACCESS_KEY", "str", "", "control-plane credentials", _Y, "boto3's default chain"),
        ("S3_ROLE_ARN", "str", "", "token vending: every instance gets STS credentials limited to its prefix; "
         "empty: instances get no S3 credentials from us"),
        ("S3_STS_ENDPOINT_URL", "str", "", "the STS endpoint", _Y, "AWS's"),
        ("S3_CREDENTIALS_DURATION_S", "int", 3600, "lifetime of vended credentials (at most 1 h for a chained role "
         "session)"),
        ("S3_ROLE_SESSION_NOT_CHAINED", "bool", False, "the control plane calls AssumeRole with IAM user "
         "credentials: up to 12 h accepted"),
        ("S3_CREDENTIALS_RENEW_BEFORE_S", "int", 900, "vended credentials are reused until this close to expiry"),
    )),
    ("Dashboard, portal, branding", (
        ("CONTROL_PLANE_HOSTS", "list", COMPUTED, "hosts serving the staff dashboard, the API and the admin (every "
         "other host is an operator portal host)", _Y, "the exact (non-wildcard) `ALLOWED_HOSTS`"),
        ("PORTAL_ALLOWED_HOSTS", "list", [".localhost"], "added to `ALLOWED_HOSTS` for portal host names "
         "(`.portal.example.com` allows a zone)"),
        ("DASHBOARD_PAGE_SIZE", "int", 25, "rows per staff dashboard page"),
        ("PORTAL_PAGE_SIZE", "int", 20, "rows per portal page"),
        ("DASHBOARD_HEARTBEAT_STALE_S", "float", 60.0, "a running instance whose last heartbeat is older is shown "
         "as \"heartbeat stale\""),
        ("DASHBOARD_EFFECT_QUEUE_TENANTS", "int", 20, "instances the dashboard's effects-in-doubt queue asks per "
         "page"),
        ("DASHBOARD_EFFECT_QUEUE_DEADLINE_S", "float", 4.0, "how long it waits for each"),
        ("DASHBOARD_SAMPLE_RETENTION_DAYS", "float", 7.0, "days of heartbeat-age and fleet-status samples (taken "
         "every minute by beat) the dashboard's charts keep"),
        ("EMAIL_URL", "url", "", "the portal's team invitations and password resets, e.g. "
         "`smtp+tls://user:password@mail.example.com:587` (django-environ's email URL)", _REQ,
         "unset: mail written as files under `var/mail`"),
        ("EMAIL_TIMEOUT", "int", 10, "SMTP timeout in seconds"),
        ("DEFAULT_FROM_EMAIL", "str", "no-reply@localhost", "sender of the portal's mail"),
        ("PORTAL_INVITATION_TTL_S", "int", 7 * 24 * 3600, "how long a team invitation link works"),
        ("PASSWORD_RESET_TIMEOUT", "int", 3 * 3600, "how long a password-reset link works"),
        ("PORTAL_PASSWORD_RESET_INTERVAL_S", "int", 60, "at most one password-reset mail per address and operator "
         "per interval"),
        ("BRANDING_LOGO_MAX_BYTES", "int", 256 * 1024, "largest logo (the theme must fit a 1 MiB ConfigMap)"),
        ("BRANDING_LOGO_MAX_PIXELS", "int", 2048, "largest logo side in pixels"),
        ("BRANDING_STALL_AFTER_S", "float", 60.0, "a pending submission or unfinished rollout that has not moved "
         "for this long is queued again by the jobs sweep (overrides `JOBS_STALL_AFTER_S`)"),
    )),
    ("Releases", (
        ("RELEASES_ROOT", "path", COMPUTED, "this machine's cache of release installs, made from the wheels in "
         "the object store when missing: may be wiped at any time ([releases](docs/releases.md))", _Y,
         "`var/releases`"),
        ("RELEASE_MAX_WHEEL_BYTES", "int", 50 * 1024 * 1024, "the largest wheel accepted (413 above)"),
        ("RELEASE_VALIDATION_TIMEOUT_S", "float", 120.0, "each validation process (pip, the import probe) is "
         "killed after this long"),
        ("RELEASE_ROLLOUT_CANARY", "int", 1, "a rollout's default canary size"),
        ("RELEASE_ROLLOUT_WAVE_SIZE", "int", 10, "a rollout's default wave size"),
        ("RELEASE_ROLLOUT_SOAK_S", "int", 60, "a rollout's default soak of each wave under the health gate"),
        ("RELEASE_ROLLOUT_CONCURRENCY", "int", 5, "instances of a wave restarted at once"),
        ("RELEASE_GATE_POLL_S", "float", 2.0, "how often the gate looks at a soaking wave"),
        ("RELEASE_RETAINED_PER_TENANT", "int", 2, "earlier releases an instance keeps loadable, so a task finishes "
         "on the release it started on ([releases](docs/releases.md#a-task-finishes-on-its-release))"),
        ("RELEASE_GATE_IN_DOUBT_AFTER_S", "float", 60.0, "an effect's intent still open this long counts as in "
         "doubt"),
        ("RELEASE_ROLLOUT_STALL_AFTER_S", "float", 120.0, "a working rollout that has not moved for this long is "
         "queued again by the jobs sweep (overrides `JOBS_STALL_AFTER_S`)"),
    )),
    ("Connected accounts", (
        ("OAUTH_ALLOW_HTTP_LOOPBACK", "bool", COMPUTED, "plain-http OAuth endpoints on a loopback host: development "
         "and tests only ([connections](docs/connections.md))", _Y, "`DEBUG`"),
        ("OAUTH_ALLOW_PRIVATE_ADDRESSES", "bool", COMPUTED, "OAuth discovery, token, userinfo and revocation URLs "
         "resolving to loopback/private/link-local/metadata addresses: development and tests only (SSRF)", _Y,
         "`DEBUG`"),
        ("OAUTH_STATE_TTL_S", "int", 600, "how long a started connect flow's `state` stays usable"),
        ("OAUTH_HTTP_TIMEOUT_S", "float", 10.0, "per request to a provider (discovery, token, userinfo)"),
        ("OAUTH_REFRESH_AHEAD_S", "int", 300, "a connection's access token is refreshed this long before it "
         "expires"),
        ("OAUTH_REFRESH_SWEEP_INTERVAL_S", "int", 60, "how often the refresh sweep runs (beat)"),
        ("OAUTH_REFRESH_SWEEP_WINDOW_S", "int", 600, "the sweep refreshes active connections whose access token "
         "expires within this; keep it above the interval plus `OAUTH_REFRESH_AHEAD_S`"),
        ("OAUTH_DELIVERY_AUDIT_INTERVAL_S", "int", 60, "at most one `connection.deliver` audit row per connection "
         "this often; the row counts the deliveries coalesced into it (0: a row per delivery)"),
    )),
    ("MCP", (
        ("MCP_SERVERS_ALLOW_HTTP", "bool", COMPUTED, "plain-http MCP server URLs in the registry: development and "
         "tests only ([mcp](docs/mcp.md))", _Y, "`DEBUG`"),
        ("MCP_ENDPOINT_WAIT_S", "float", 30.0, "longest a `tools/call` of a customer's agent MCP endpoint waits "
         "for the task's result before answering with its id"),
    )),
    ("Egress", (
        ("EGRESS_ALLOW_PRIVATE_ADDRESSES", "bool", False, "let a tenant's egress proxy connect to hosts resolving to "
         "loopback/private/link-local addresses: tests only. Off even in development, where the proxy is an "
         "instance's only way out of its network namespace ([security](docs/security.md#egress))", _OFF),
        ("EGRESS_PROXY_ADDRESS", "str", "", "`host:port` of the machine's egress proxy (`manage.py egress_proxy`, "
         "supervised by `make run` whenever instances are isolated, at the web port + 30): each isolated instance "
         "is granted a path to it and gets `HTTPS_PROXY`/`HTTP_PROXY` with its tenant id and instance token as the "
         "proxy credential. Empty: isolated instances have no way out ([security](docs/security.md#egress))"),
        ("EGRESS_MAX_CONNECTIONS", "int", 64, "connections one tenant's egress proxy serves at once (per tenant in "
         "the machine's proxy); the next gets a 503"),
        ("EGRESS_MAX_CONNECTIONS_TOTAL", "int", 1024, "connections the machine's egress proxy serves at once, all "
         "tenants together; the next gets a 503"),
        ("EGRESS_HEADER_TIMEOUT_S", "float", 10.0, "a client must send its whole request head within this"),
        ("EGRESS_CONNECT_TIMEOUT_S", "float", 10.0, "to resolve and to reach the peer"),
        ("EGRESS_IDLE_TIMEOUT_S", "float", 60.0, "a tunnel or request with no byte read either way for this long is "
         "cut"),
        ("EGRESS_MAX_DURATION_S", "float", 3600.0, "the longest a tunnel or request lives"),
        ("EGRESS_RULES_REFRESH_S", "float", 5.0, "a running proxy re-reads its tenant's allow-list this often: a "
         "rule added or deleted applies to new connections within it"),
        ("EGRESS_MAX_RULES_PER_OPERATOR", "int", 500, "egress rules per operator, all scopes together"),
        ("EGRESS_LOG_KEEP_PER_TENANT", "int", 1000, "the newest egress decisions kept per tenant"),
    )),
    ("Webhooks", (
        ("WEBHOOK_ALLOW_HTTP", "bool", COMPUTED, "plain-http webhook URLs: development and tests only (SSRF)", _Y,
         "`DEBUG`"),
        ("WEBHOOK_ALLOW_PRIVATE_ADDRESSES", "bool", COMPUTED, "URLs resolving to loopback/private/link-local "
         "addresses: development and tests only (SSRF)", _Y, "`DEBUG`"),
        ("WEBHOOK_TIMEOUT_S", "float", 10.0, "per socket operation of one attempt ([webhooks](docs/webhooks.md))"),
        ("WEBHOOK_RETRY_SCHEDULE_S", "list[float]", [10, 60, 300, 900, 1800, 3600, 7200, 14400], "waits between "
         "attempts (about 8 h), then the delivery is failed and its endpoint `failing`"),
        ("WEBHOOK_SWEEP_GRACE_S", "float", 30.0, "beat re-queues pending deliveries this long past due"),
        ("WEBHOOK_COUNTDOWN_MAX_S", "float", 60.0, "retries up to this far off wait as countdown messages; longer "
         "ones are queued by the sweep (keep it under `CELERY_VISIBILITY_TIMEOUT_S`)"),
        ("WEBHOOK_MAX_ENDPOINTS", "int", 20, "endpoints per operator"),
        ("WEBHOOK_LEASE_S", "float", 0.0, "how long an attempt holds its delivery", _Y, "0: 3 x the timeout + 30 s"),
        ("WEBHOOK_LOG_RESPONSE_BYTES", "int", 4096, "how much of each receiver's answer the delivery log keeps "
         "(its body's first bytes; headers from a short allow-list only)"),
        ("WEBHOOK_RUNTIME_EVENTS", "bool", True, "the webhooks sweep reads each instance's tables for `task.succeeded`"
         ", `task.blocked`, `task.failed` and `message.replied` (one query per tenant per sweep)"),
    )),
    ("Usage", (
        ("USAGE_COLLECT_INTERVAL_S", "float", 300.0, "how often beat's job recounts every customer's usage for "
         "yesterday and today (and days it missed) from its instance's tables (the portal's usage card and the "
         "usage API are this fresh); applied to the beat schedule at the next `migrate` ([api](docs/api.md))"),
    )),
    ("Schedules", (
        ("SCHEDULES_SWEEP_INTERVAL_S", "float", 2.0, "how often beat's schedules sweep fires what is due (a fire is "
         "at most about this late); applied to the beat schedule at the next `migrate` "
         "([schedules](docs/schedules.md))"),
        ("SCHEDULES_MISFIRE_GRACE_S", "float", 60.0, "a fire time at most this old when the sweep sees it is run "
         "late; an older one was missed (beat or workers down) and the schedule's catch-up policy decides"),
    )),
    ("HTTPS and browser security", (
        ("SECURE_TLS", "bool", COMPUTED, "TLS is on: the defaults of the four below", _Y, "`DJANGO_ENV=production`"),
        ("TRUST_X_FORWARDED_PROTO", "bool", False, "trust the ingress's `X-Forwarded-Proto` (only when it sets and "
         "strips it)"),
        ("SECURE_SSL_REDIRECT", "bool", COMPUTED, "redirect http to https (not `/internal/`, probes, metrics)", _Y,
         "`SECURE_TLS`"),
        ("SESSION_COOKIE_SECURE", "bool", COMPUTED, "session cookie over HTTPS only", _Y, "`SECURE_TLS`"),
        ("CSRF_COOKIE_SECURE", "bool", COMPUTED, "CSRF cookie over HTTPS only", _Y, "`SECURE_TLS`"),
        ("SECURE_HSTS_SECONDS", "int", COMPUTED, "HSTS max-age", _Y, "one year with `SECURE_TLS`, else 0"),
        ("SECURE_HSTS_INCLUDE_SUBDOMAINS", "bool", COMPUTED, "HSTS includeSubDomains", _Y, "`SECURE_TLS`"),
        ("SECURE_HSTS_PRELOAD", "bool", False, "HSTS preload (a per-domain commitment that is slow to undo)"),
        ("SESSION_COOKIE_AGE", "int", 12 * 3600, "seconds a staff or portal session lasts"),
        ("CONTENT_SECURITY_POLICY", "str",
         "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
         "font-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
         "frame-ancestors 'none'", "the header on every response that does not set its own", _Y,
         "same-origin scripts only (`controlplane/config_table.py`)"),
    )),
    ("Fault injection (tests only)", (
        (FAULT_INJECTION_SWITCH, "bool", False, "allow the settings below (chaos tests); without it any of them "
         "set refuses to start", _TEST),
        ("PROVISIONING_PAUSE_AFTER_EFFECT_S", "float", 0.0, "pause after a step's external effect, before its "
         "completion is recorded, so a test can SIGKILL the worker there", _TEST),
        ("PROVISIONING_PAUSE_STEP", "str", "", "only pause after this step", _TEST, "every step"),
        ("VAULT_ROTATION_PAUSE_PER_ITEM_S", "float", 0.0, "pause after each committed unit of rotation work", _TEST),
        ("BRANDING_ROLLOUT_PAUSE_PER_ITEM_S", "float", 0.0, "pause after each committed instance of a branding "
         "rollout", _TEST),
        ("SCHEDULES_PAUSE_S", "float", 0.0, "pause the schedules sweep at `SCHEDULES_PAUSE_AT` so a test can SIGKILL "
         "it there", _TEST),
        ("SCHEDULES_PAUSE_AT", "str", "", "`materialized` (fire rows committed, none dispatched), `submitted` "
         "(a fire's inbox item committed, the fire not yet marked) or `agent_answer` (an agent's `ctx.schedule` "
         "made or looked up, its answer not yet sent)", _TEST, "nowhere"),
    )),
)

SETTINGS: Final[dict[str, Setting]] = {
    row[0]: Setting(row[0], row[1], row[2], row[3], section, *row[4:])
    for section, rows in _TABLE for row in rows
}


def fault_knobs() -> list[str]:
    """The fault-injection settings, the switch excluded."""
    return [s.name for s in SETTINGS.values() if s.production is Production.TEST_ONLY
            and s.name != FAULT_INJECTION_SWITCH]


def _is_set(environ: Mapping[str, str], name: str) -> bool:
    return environ.get(name, "").strip() != ""


def fault_injection_problems(environ: Mapping[str, str], *, production: bool) -> list[str]:
    """Why this environment may not start: a fault knob outside the tests. Messages name variables, never values.

    In production any test-only variable is refused, the switch included; elsewhere a knob needs the switch, so a
    pause left in a deployment's environment fails loudly instead of stalling every provisioning step."""
    if production:
        return [f"{name} is a fault-injection setting for tests, refused in production"
                for name in SETTINGS if SETTINGS[name].production is Production.TEST_ONLY and _is_set(environ, name)]
    switch = environ.get(FAULT_INJECTION_SWITCH, "").strip().lower() in ("true", "on", "ok", "y", "yes", "1")
    if switch:
        return []
    return [f"{name} is a fault-injection setting: set {FAULT_INJECTION_SWITCH}=1 to use it (tests only)"
            for name in fault_knobs() if _is_set(environ, name)]


def loopback_grant_problem(address: str) -> str:
    """What is wrong with one ``LOCAL_INSTANCE_LOOPBACK_GRANTS`` entry (empty: nothing): it must be an exact
    IPv4 loopback literal and a port, never a name (resolved later, it could lead elsewhere) nor a private or public
    address (those are the egress proxy's to judge)."""
    import ipaddress

    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        return f"{address!r} is not ip:port"
    try:
        loopback = ipaddress.IPv4Address(host).is_loopback
    except ValueError:
        return f"{address!r}: {host!r} is not an IPv4 address (a loopback literal such as 127.0.0.1)"
    return "" if loopback else f"{address!r}: {host} is not a loopback address"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table(settings: Iterable[Setting] | None = None) -> str:
    """The README's configuration section body: one table per section, in declaration order."""
    rows = list(SETTINGS.values() if settings is None else settings)
    out: list[str] = []
    for section in dict.fromkeys(s.section for s in rows):
        out += [f"### {section}", "", "| variable | type | default | production | meaning |",
                "| --- | --- | --- | --- | --- |"]
        for s in rows:
            if s.section == section:
                default = s.shown_default if s.shown or s.shown_default == "empty" else f"`{s.shown_default}`"
                out.append(f"| `{s.name}` | {s.type} | {_cell(default)} | {s.production.value} | {_cell(s.doc)} |")
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"
