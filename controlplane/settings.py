"""Settings, read from the environment with django-environ.

Nothing here has a production secret baked in: with no environment at all the
project runs on one machine (embedded PostgreSQL, embedded Redis as the broker, local
drivers, a development key ring generated under ``var/``). Production sets
``DATABASE_URL``, ``CELERY_BROKER_URL``, ``SECRET_KEY`` and ``VAULT_KEK_KEYRING``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import environ

from .secretfiles import DEV_SECRET_KEY_FILE, dev_secret

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False) if (BASE_DIR / ".env").exists() else None

VAR_DIR = Path(env.str("CONTROLPLANE_VAR_DIR", default=str(BASE_DIR / "var"))).resolve()
VAR_DIR.mkdir(parents=True, exist_ok=True)

DEBUG = env.bool("DEBUG", default=False)
# Generated once per var/ directory (never committed), so a demo needs no setup. Created atomically
# (controlplane.secretfiles): processes starting together all end up with the same key.
SECRET_KEY = env.str("SECRET_KEY", default="") or dev_secret(VAR_DIR, DEV_SECRET_KEY_FILE)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]", "testserver"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "django_celery_beat",
    "tenants",
    "vault",
    "provisioning",
    "conversations",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "controlplane.urls"
WSGI_APPLICATION = "controlplane.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database: DATABASE_URL, or the embedded PostgreSQL (pgserver) when unset.
if env.str("DATABASE_URL", default=""):
    DATABASES = {"default": env.db_url("DATABASE_URL")}
    EMBEDDED_POSTGRES = False
    _EMBEDDED_TENANT_DATABASE_URL = ""
else:
    from .embedded_pg import CONTROL_PLANE_DATABASE, SUPERUSER, TENANT_DATABASE, embedded_server

    # Every role logs in with its password there (SCRAM, no trust): the superuser's is var/secrets/.
    _embedded = embedded_server(VAR_DIR / "pgdata")
    EMBEDDED_DATABASE_URL = _embedded.url(CONTROL_PLANE_DATABASE)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": CONTROL_PLANE_DATABASE,
            "USER": SUPERUSER,
            "PASSWORD": _embedded.password,
            "HOST": str(_embedded.socket_dir),
            "PORT": str(_embedded.port),
        }
    }
    EMBEDDED_POSTGRES = True
    _EMBEDDED_TENANT_DATABASE_URL = _embedded.url(TENANT_DATABASE)
# The embedded default's own PgBouncer in front of its tenant database (controlplane/pgbouncer.py; `make demo`
# turns it on where Debian's pgbouncer is installed): instances connect through it in transaction mode.
EMBEDDED_PGBOUNCER = env.bool("EMBEDDED_PGBOUNCER", default=False)
_EMBEDDED_POOLER_URL = ""
if EMBEDDED_PGBOUNCER and EMBEDDED_POSTGRES and not env.str("TENANT_DATABASE_URL", default=""):
    from .pgbouncer import embedded_pgbouncer

    try:
        _EMBEDDED_POOLER_URL = (f"host=127.0.0.1 port={embedded_pgbouncer(VAR_DIR / 'pgbouncer', _embedded)}"
                                f" dbname={TENANT_DATABASE}")
    except RuntimeError as _exc:  # not installed, or it did not start: direct connections, said once per process
        print(f"EMBEDDED_PGBOUNCER: {_exc}; instances connect to PostgreSQL directly", file=sys.stderr)
# Persistent connections save a connect per request under gunicorn's threads (production: 60). 0 for runserver,
# which starts a thread per request and would leave one connection behind per request.
DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("DB_CONN_MAX_AGE", default=0))
DATABASES["default"].setdefault("CONN_HEALTH_CHECKS", True)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"

# --- REST API
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["tenants.api.authentication.OperatorTokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["tenants.api.permissions.IsOperator"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "controlplane.problems.problem_exception_handler",
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Agent control plane API",
    "DESCRIPTION": "Onboard customers and manage their isolated, persistent agent instances.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # 3.1 (full JSON Schema): `propertyNames` for metadata keys and the like are part of the contract that
    # clients and fuzzers read; OpenAPI 3.0 has no such keyword and schemathesis ignored it there.
    "OAS_VERSION": "3.1.0",
}
# Oversized bodies are refused before parsing (400 problem+json through the handler).
DATA_UPLOAD_MAX_MEMORY_SIZE = env.int("DATA_UPLOAD_MAX_MEMORY_SIZE", default=256 * 1024)

# --- Celery
# CELERY_BROKER_URL, or the embedded Redis (controlplane/embedded_redis.py: var/redis, a unix socket and a
# generated password) when unset. The heartbeats and the cache default to the broker's Redis too.
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="")
EMBEDDED_REDIS = not CELERY_BROKER_URL
_BROKER_REDIS_URL = ""  # the broker's Redis as redis-py spells it; empty when the broker is no Redis
if EMBEDDED_REDIS:
    from .embedded_redis import embedded_redis

    try:
        _embedded_redis = embedded_redis(VAR_DIR / "redis")
    except RuntimeError as _exc:  # one sentence (manage.py prints it as such), not a traceback
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(str(_exc)) from _exc
    CELERY_BROKER_URL = _embedded_redis.broker_url
    _BROKER_REDIS_URL = _embedded_redis.client_url
elif CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
    _BROKER_REDIS_URL = CELERY_BROKER_URL
# Unacked messages of a worker that died are redelivered after this long (Redis transport).
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": env.int("CELERY_VISIBILITY_TIMEOUT_S", default=120)}
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_TASK_DEFAULT_QUEUE = env.str("CELERY_TASK_DEFAULT_QUEUE", default="controlplane")

# --- Provisioning
PROVISIONING_PROFILE = env.str("PROVISIONING_PROFILE", default="local")
# "deferred": provision every resource but start no instance (bulk pre-provisioning, benchmarks).
PROVISIONING_RUNTIME_DRIVER = env.str("PROVISIONING_RUNTIME_DRIVER", default="")
# Prefix of every tenant schema and role name. Names are derived from the tenant id, never from input.
TENANT_NAME_PREFIX = env.str("TENANT_NAME_PREFIX", default="t_")
# Database that holds tenant schemas: the control plane's own unless set; on the embedded default the
# database "tenants" on the embedded server, reached over 127.0.0.1 (the instances' sandbox hides var/).
TENANT_DATABASE_URL = env.str("TENANT_DATABASE_URL", default="") or _EMBEDDED_TENANT_DATABASE_URL
# A PgBouncer in transaction mode in front of that server (libpq DSN or URL, no user or password: tenant roles log
# in through it with their own): instances on the setting's server connect there (AGENT_DATABASE_POOLED=1) and
# hold no idle session. Empty: the record keeps what `manage.py database_servers set default --pooler` gave it.
TENANT_DATABASE_POOLER_URL = env.str("TENANT_DATABASE_POOLER_URL", default="") or _EMBEDDED_POOLER_URL
# The product owns that server: provisioning also takes CONNECT on its other databases away from PUBLIC.
TENANT_DATABASE_EMBEDDED = TENANT_DATABASE_URL == _EMBEDDED_TENANT_DATABASE_URL != ""
# Provision onto a server whose pg_hba.conf lets a tenant role in without its password (trust) anyway; the
# database resource records "auth": "insecure-override" (provisioning/drivers/pg_auth.py). Never in production.
TENANT_DATABASE_ALLOW_INSECURE_AUTH = env.bool("TENANT_DATABASE_ALLOW_INSECURE_AUTH", default=False)
LOCAL_VOLUME_ROOT = Path(env.str("LOCAL_VOLUME_ROOT", default=str(VAR_DIR / "volumes"))).resolve()
LOCAL_OBJECTSTORE_ROOT = Path(
    env.str("LOCAL_OBJECTSTORE_ROOT", default=str(VAR_DIR / "objectstore"))
).resolve()
# One OS user and one bubblewrap sandbox per local instance (provisioning/drivers/local_sandbox.py):
# "auto" sandboxes where possible (root, bwrap) and marks the tenant's isolation degraded elsewhere,
# "required" refuses to start an instance it cannot sandbox (always so in production), "off" never sandboxes.
LOCAL_INSTANCE_ISOLATION = env.str("LOCAL_INSTANCE_ISOLATION", default="auto")
if LOCAL_INSTANCE_ISOLATION not in ("auto", "required", "off"):
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(
        f"LOCAL_INSTANCE_ISOLATION must be auto, required or off, not {LOCAL_INSTANCE_ISOLATION!r}")
SCHEMA_ARCHIVE_RETENTION_DAYS = env.int("SCHEMA_ARCHIVE_RETENTION_DAYS", default=30)
WORKFLOW_STEP_MAX_ATTEMPTS = env.int("WORKFLOW_STEP_MAX_ATTEMPTS", default=5)
WORKFLOW_RETRY_BACKOFF_S = env.float("WORKFLOW_RETRY_BACKOFF_S", default=2.0)
# A run that has not moved for this long with no worker holding its lock is re-queued by the sweep.
WORKFLOW_STALL_AFTER_S = env.float("WORKFLOW_STALL_AFTER_S", default=30.0)
RUNTIME_READY_TIMEOUT_S = env.float("RUNTIME_READY_TIMEOUT_S", default=30.0)
# Fault injection for chaos tests: pause this long after a step's external effect and before its
# completion is recorded, so a test can SIGKILL the worker at the worst moment. Zero in production.
PROVISIONING_PAUSE_AFTER_EFFECT_S = env.float("PROVISIONING_PAUSE_AFTER_EFFECT_S", default=0.0)
PROVISIONING_PAUSE_STEP = env.str("PROVISIONING_PAUSE_STEP", default="")  # empty: every step

# --- Vault: key-encryption keys. "local": a key ring "v1:<base64 32 bytes>,v2:..." (newest encrypts).
VAULT_KEK_PROVIDER = env.str("VAULT_KEK_PROVIDER", default="local")
VAULT_KEK_KEYRING = env.str("VAULT_KEK_KEYRING", default="")
VAULT_KMS_KEY_ID = env.str("VAULT_KMS_KEY_ID", default="")
AWS_ENDPOINT_URL = env.str("AWS_ENDPOINT_URL", default="") or None

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}, "pgserver": {"level": "WARNING"}},
}

# --- Instances
# Base URL instances use for heartbeats and credential delivery (internal endpoints); empty: none.
CONTROL_PLANE_INTERNAL_URL = env.str("CONTROL_PLANE_INTERNAL_URL", default="")
RUNTIME_STOP_GRACE_S = env.float("RUNTIME_STOP_GRACE_S", default=20.0)
# Scale to zero (provisioning/sleep.py, docs/operations.md): an instance with no activity for this long (nothing
# in its inbox, no task pending or running, no effect in flight, nothing written to its schema) is stopped
# cleanly and marked asleep; the next message or task wakes it (about 1 s to boot and read back here). 15
# minutes by default: a conversation's pauses stay well inside it, while a fleet of mostly idle customers stops
# paying two PostgreSQL sessions and a process each. 0 turns sleeping off.
INSTANCE_IDLE_SUSPEND_S = env.float("INSTANCE_IDLE_SUSPEND_S", default=900.0)
# Extra non-secret settings for every instance, e.g. "AGENT_SMTP_URL=smtp://127.0.0.1:8025", or a JSON object
# of strings when a value holds commas (AGENT_CONFIG is JSON itself).
_instance_extra = env.str("INSTANCE_EXTRA_ENV", default="").strip()
INSTANCE_EXTRA_ENV = {k: str(v) for k, v in (json.loads(_instance_extra) if _instance_extra.startswith("{")
                                             else env.dict("INSTANCE_EXTRA_ENV", default={})).items()
                      if k.startswith("AGENT_")}

# --- Recovery (issue 6)
# Heartbeats go to Redis when there is one (the broker's unless set); otherwise to PostgreSQL.
HEARTBEAT_REDIS_URL = env.str("HEARTBEAT_REDIS_URL", default=_BROKER_REDIS_URL)
HEARTBEAT_KEY_PREFIX = env.str("HEARTBEAT_KEY_PREFIX", default="cp:hb")
# Dead: no heartbeat for this long. Hung: a step in flight whose progress marker has not moved for this long.
HEARTBEAT_TIMEOUT_S = env.float("HEARTBEAT_TIMEOUT_S", default=10.0)
PROGRESS_STALL_TIMEOUT_S = env.float("PROGRESS_STALL_TIMEOUT_S", default=60.0)
# The Celery worker and beat each write a heartbeat of their own (controlplane/liveness.py) to the heartbeats'
# Redis this often; none fresher than the timeout (or an exit the supervisor reported) means that service is
# down: /readyz answers 503 and the staff dashboard's overview turns red with the reason.
SERVICE_HEARTBEAT_INTERVAL_S = env.float("SERVICE_HEARTBEAT_INTERVAL_S", default=2.0)
SERVICE_HEARTBEAT_TIMEOUT_S = env.float("SERVICE_HEARTBEAT_TIMEOUT_S", default=10.0)
RECOVERY_SWEEP_INTERVAL_S = env.float("RECOVERY_SWEEP_INTERVAL_S", default=5.0)
# The process that starts a local instance waits on it and starts its recovery the moment it exits
# (provisioning/exit_notice.py); `manage.py watch_instances` notices the exit of every local instance, whoever
# started it (provisioning/local_exit_watch.py); the heartbeat timeout remains for hangs.
LOCAL_EXIT_NOTICE = env.bool("LOCAL_EXIT_NOTICE", default=True)
RECOVERY_BACKOFF_BASE_S = env.float("RECOVERY_BACKOFF_BASE_S", default=10.0)
RECOVERY_MAX_FAILURES = env.int("RECOVERY_MAX_FAILURES", default=3)
RECOVERY_FAILURE_WINDOW_S = env.float("RECOVERY_FAILURE_WINDOW_S", default=900.0)
RECOVERY_STOP_GRACE_S = env.float("RECOVERY_STOP_GRACE_S", default=5.0)
# The same for a hung instance: it does not act on SIGTERM (a stopped process never does, a wedged main loop
# neither), and what it committed is durable, so the full grace only delays the recovery.
RECOVERY_HUNG_STOP_GRACE_S = env.float("RECOVERY_HUNG_STOP_GRACE_S", default=1.0)
RECOVERY_VERIFY_TIMEOUT_S = env.float("RECOVERY_VERIFY_TIMEOUT_S", default=60.0)
ROLLING_RESTART_CONCURRENCY = env.int("ROLLING_RESTART_CONCURRENCY", default=1)
SCHEMA_BACKUP_INTERVAL_S = env.float("SCHEMA_BACKUP_INTERVAL_S", default=6 * 3600)
# Bearer token a Prometheus scraper presents at /metrics; empty: staff sessions only.
METRICS_TOKEN = env.str("METRICS_TOKEN", default="")

# --- Vault (issue 4)
# Region for the aws-kms provider (else boto3's usual resolution: AWS_DEFAULT_REGION, config files).
VAULT_KMS_REGION = env.str("VAULT_KMS_REGION", default="") or None
# An unfinished rotation job that has not moved for this long is queued again by the beat sweep.
VAULT_ROTATION_STALL_AFTER_S = env.float("VAULT_ROTATION_STALL_AFTER_S", default=60.0)
# Fault injection for chaos tests: pause after each committed unit of rotation work. Zero in production.
VAULT_ROTATION_PAUSE_PER_ITEM_S = env.float("VAULT_ROTATION_PAUSE_PER_ITEM_S", default=0.0)
# A retired data key is destroyed (crypto-shredding, vault/shredding.py) no sooner than this after retirement,
# and only once no archive or credential it sealed may still exist: a reader that fetched a ciphertext just
# before the retirement can still open it.
VAULT_SHRED_GRACE_S = env.float("VAULT_SHRED_GRACE_S", default=86400.0)

# --- Production profile (issue 5): Kubernetes runtime + volume, S3 object store.
# Selected by PROVISIONING_PROFILE=kubernetes; every value below is read only by those drivers.
# API access: in-cluster service account, else a kubeconfig file (and context), else ~/.kube/config.
KUBERNETES_IN_CLUSTER = env.bool("KUBERNETES_IN_CLUSTER", default=False)
KUBERNETES_KUBECONFIG = env.str("KUBERNETES_KUBECONFIG", default="")
KUBERNETES_CONTEXT = env.str("KUBERNETES_CONTEXT", default="") or None
KUBERNETES_FIELD_MANAGER = env.str("KUBERNETES_FIELD_MANAGER", default="agent-control-plane")
KUBERNETES_REQUEST_TIMEOUT_S = env.float("KUBERNETES_REQUEST_TIMEOUT_S", default=30.0)
# Tenant namespace = prefix + DNS-1123 form of the tenant's resource name (at most 63 characters).
KUBERNETES_NAMESPACE_PREFIX = env.str("KUBERNETES_NAMESPACE_PREFIX", default="tenant-")
KUBERNETES_AGENT_IMAGE = env.str("KUBERNETES_AGENT_IMAGE", default="ghcr.io/example/agent-host:0.1.0")
KUBERNETES_IMAGE_PULL_POLICY = env.str("KUBERNETES_IMAGE_PULL_POLICY", default="IfNotPresent")
KUBERNETES_IMAGE_PULL_SECRET = env.str("KUBERNETES_IMAGE_PULL_SECRET", default="")
KUBERNETES_STORAGE_CLASS = env.str("KUBERNETES_STORAGE_CLASS", default="")
# ReadWriteOncePod (CSI volumes, Kubernetes >= 1.29) lets the volume itself refuse a second writer.
KUBERNETES_VOLUME_ACCESS_MODE = env.str("KUBERNETES_VOLUME_ACCESS_MODE", default="ReadWriteOnce")
KUBERNETES_VOLUME_MOUNT_PATH = env.str("KUBERNETES_VOLUME_MOUNT_PATH", default="/data")
KUBERNETES_AGENT_UID = env.int("KUBERNETES_AGENT_UID", default=10001)
# SIGTERM -> agent-host stops after the current step within AGENT_GRACE_PERIOD_S, then flushes; the
# pod's terminationGracePeriodSeconds adds this margin so the kubelet never SIGKILLs a clean flush.
KUBERNETES_AGENT_GRACE_PERIOD_S = env.int("KUBERNETES_AGENT_GRACE_PERIOD_S", default=45)
KUBERNETES_FLUSH_MARGIN_S = env.int("KUBERNETES_FLUSH_MARGIN_S", default=15)
# "Ready" = the StatefulSet reports readyReplicas >= 1 for the current revision (its pod passed /readyz).
KUBERNETES_READY_TIMEOUT_S = env.float("KUBERNETES_READY_TIMEOUT_S", default=300.0)
KUBERNETES_READY_POLL_S = env.float("KUBERNETES_READY_POLL_S", default=2.0)
KUBERNETES_NAMESPACE_DELETE_TIMEOUT_S = env.float("KUBERNETES_NAMESPACE_DELETE_TIMEOUT_S", default=300.0)
# NetworkPolicy egress allows (everything else is denied). The control plane: its namespace + pod labels.
KUBERNETES_CONTROL_PLANE_NAMESPACE = env.str("KUBERNETES_CONTROL_PLANE_NAMESPACE", default="agent-control-plane")
KUBERNETES_CONTROL_PLANE_POD_LABELS = env.dict(
    "KUBERNETES_CONTROL_PLANE_POD_LABELS", default={"app.kubernetes.io/name": "agent-control-plane"}
)
KUBERNETES_CONTROL_PLANE_PORT = env.int("KUBERNETES_CONTROL_PLANE_PORT", default=8000)
KUBERNETES_DNS_NAMESPACE = env.str("KUBERNETES_DNS_NAMESPACE", default="kube-system")
KUBERNETES_DNS_POD_LABELS = env.dict("KUBERNETES_DNS_POD_LABELS", default={"k8s-app": "kube-dns"})
KUBERNETES_POSTGRES_CIDRS = env.list("KUBERNETES_POSTGRES_CIDRS", default=[])
KUBERNETES_POSTGRES_NAMESPACE = env.str("KUBERNETES_POSTGRES_NAMESPACE", default="")
KUBERNETES_POSTGRES_PORT = env.int("KUBERNETES_POSTGRES_PORT", default=5432)
KUBERNETES_OBJECTSTORE_CIDRS = env.list("KUBERNETES_OBJECTSTORE_CIDRS", default=[])
KUBERNETES_OBJECTSTORE_NAMESPACE = env.str("KUBERNETES_OBJECTSTORE_NAMESPACE", default="")
KUBERNETES_OBJECTSTORE_PORTS = env.list("KUBERNETES_OBJECTSTORE_PORTS", cast=int, default=[443])
# Plan -> quotas and per-container resources. Override with KUBERNETES_PLANS_JSON ({"plan": {...}}).
KUBERNETES_PLANS = {
    "standard": {
        "cpu_request": "250m", "cpu_limit": "1", "memory_request": "512Mi", "memory_limit": "1Gi",
        "storage": "5Gi",
    },
    "large": {
        "cpu_request": "1", "cpu_limit": "2", "memory_request": "2Gi", "memory_limit": "4Gi",
        "storage": "50Gi",
    },
}
KUBERNETES_PLANS.update(env.json("KUBERNETES_PLANS_JSON", default={}))

# S3 (any S3-compatible endpoint): one bucket, prefix tenants/<tenant-id>/ per tenant.
S3_BUCKET = env.str("S3_BUCKET", default="")
S3_REGION = env.str("S3_REGION", default="us-east-1")
S3_ENDPOINT_URL = env.str("S3_ENDPOINT_URL", default="") or None
# The endpoint as instances reach it (in-cluster DNS may differ from the control plane's); default: same.
S3_INSTANCE_ENDPOINT_URL = env.str("S3_INSTANCE_ENDPOINT_URL", default="") or None
S3_CREATE_BUCKET = env.bool("S3_CREATE_BUCKET", default=False)
# Control-plane credentials; empty: boto3's default chain (IRSA, instance profile, AWS_* variables).
S3_ACCESS_KEY_ID = env.str("S3_ACCESS_KEY_ID", default="")
S3_SECRET_ACCESS_KEY = env.str("S3_SECRET_ACCESS_KEY", default="")
# Token vending: with a role ARN every instance gets STS AssumeRole credentials limited by its
# prefix-scoped session policy. Without one, instances get no S3 credentials from us.
S3_ROLE_ARN = env.str("S3_ROLE_ARN", default="")
S3_STS_ENDPOINT_URL = env.str("S3_STS_ENDPOINT_URL", default="") or None
# At most 1 h: AWS's limit for a chained role session (the control plane itself on assumed-role credentials).
# A running instance renews its own before expiry (GET /internal/v1/s3-credentials/<tenant>), no restart.
S3_CREDENTIALS_DURATION_S = env.int("S3_CREDENTIALS_DURATION_S", default=3600)
# true only when the control plane calls AssumeRole with IAM user credentials: then up to the role's
# MaxSessionDuration (12 h at most) is accepted.
S3_ROLE_SESSION_NOT_CHAINED = env.bool("S3_ROLE_SESSION_NOT_CHAINED", default=False)
# Vended credentials are reused until this close to expiry, so re-applying changes nothing.
S3_CREDENTIALS_RENEW_BEFORE_S = env.int("S3_CREDENTIALS_RENEW_BEFORE_S", default=900)
from provisioning.drivers.s3_session import session_duration_problem  # noqa: E402

if _s3_session_problem := session_duration_problem(
    duration_s=S3_CREDENTIALS_DURATION_S, renew_before_s=S3_CREDENTIALS_RENEW_BEFORE_S,
    not_chained=S3_ROLE_SESSION_NOT_CHAINED,
):
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(_s3_session_problem)

# --- Dashboard, portal, branding (issue 7)
INSTALLED_APPS += ["dashboard", "portal", "branding"]
# Operator hosts get the portal's URL map; must run before URL resolution (and CommonMiddleware's slash check).
MIDDLEWARE.insert(MIDDLEWARE.index("django.middleware.common.CommonMiddleware"),
                  "portal.middleware.OperatorHostMiddleware")
# Hosts that serve the staff dashboard, the API and the admin (same matching rules as ALLOWED_HOSTS).
# Default: the exact (non-wildcard) ALLOWED_HOSTS. Every other host is an operator portal host,
# resolved through Operator.domains; an unknown one gets 404.
CONTROL_PLANE_HOSTS = env.list(
    "CONTROL_PLANE_HOSTS", default=[h for h in ALLOWED_HOSTS if h and not h.startswith(".") and h != "*"]
)
# Portal host names (Operator.domains) must also pass ALLOWED_HOSTS: ".portal.example.com" allows a
# whole zone. The default allows *.localhost, which only ever resolves to this machine.
ALLOWED_HOSTS += env.list("PORTAL_ALLOWED_HOSTS", default=[".localhost"])
LOGIN_URL = "dashboard:login"
DASHBOARD_PAGE_SIZE = env.int("DASHBOARD_PAGE_SIZE", default=25)
PORTAL_PAGE_SIZE = env.int("PORTAL_PAGE_SIZE", default=20)
# Portal mail (team invitations, password reset) goes through Django's EMAIL_BACKEND. EMAIL_URL configures
# it (smtp+tls://user:password@host:587, consolemail://, ...); unset, mail is written as files under
# var/mail, so a bare machine works and no link with a token ever reaches the process log.
_email = (env.email_url("EMAIL_URL") if env.str("EMAIL_URL", default="")
          else {"EMAIL_BACKEND": "django.core.mail.backends.filebased.EmailBackend"})
EMAIL_BACKEND = _email["EMAIL_BACKEND"]
EMAIL_FILE_PATH = _email.get("EMAIL_FILE_PATH") or str(VAR_DIR / "mail")
EMAIL_HOST = _email.get("EMAIL_HOST") or "localhost"
EMAIL_PORT = _email.get("EMAIL_PORT") or 25
EMAIL_HOST_USER = _email.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = _email.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = _email.get("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = _email.get("EMAIL_USE_SSL", False)
EMAIL_TIMEOUT = env.int("EMAIL_TIMEOUT", default=10)
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="no-reply@localhost")
# How long a team invitation link works; Django's own PASSWORD_RESET_TIMEOUT covers reset links.
PORTAL_INVITATION_TTL_S = env.int("PORTAL_INVITATION_TTL_S", default=7 * 24 * 3600)
PASSWORD_RESET_TIMEOUT = env.int("PASSWORD_RESET_TIMEOUT", default=3 * 3600)
# At most one password-reset mail per address and operator in this many seconds (the page says the same).
PORTAL_PASSWORD_RESET_INTERVAL_S = env.int("PORTAL_PASSWORD_RESET_INTERVAL_S", default=60)
# A running instance whose last heartbeat is older than this is shown as "heartbeat stale".
DASHBOARD_HEARTBEAT_STALE_S = env.float("DASHBOARD_HEARTBEAT_STALE_S", default=60.0)
# The effects-in-doubt queue asks this many ready instances per page load, each within this many seconds.
DASHBOARD_EFFECT_QUEUE_TENANTS = env.int("DASHBOARD_EFFECT_QUEUE_TENANTS", default=20)
DASHBOARD_EFFECT_QUEUE_DEADLINE_S = env.float("DASHBOARD_EFFECT_QUEUE_DEADLINE_S", default=4.0)
# Logos: PNG, JPEG, WebP or SVG (sanitized); the theme (logo inlined) must fit a 1 MiB ConfigMap.
BRANDING_LOGO_MAX_BYTES = env.int("BRANDING_LOGO_MAX_BYTES", default=256 * 1024)
BRANDING_LOGO_MAX_PIXELS = env.int("BRANDING_LOGO_MAX_PIXELS", default=2048)
# A pending submission or unfinished rollout that has not moved for this long is queued again by beat.
BRANDING_STALL_AFTER_S = env.float("BRANDING_STALL_AFTER_S", default=60.0)
# Fault injection for chaos tests: pause after each committed instance of a rollout. Zero in production.
BRANDING_ROLLOUT_PAUSE_PER_ITEM_S = env.float("BRANDING_ROLLOUT_PAUSE_PER_ITEM_S", default=0.0)
TEMPLATES[0]["OPTIONS"]["context_processors"].append("portal.context_processors.portal_context")

# --- Agent releases (issue 14): docs/releases.md
INSTALLED_APPS += ["releases"]
# Wheels (under their digest) and their installs, one directory per digest.
RELEASES_ROOT = Path(env.str("RELEASES_ROOT", default=str(VAR_DIR / "releases"))).resolve()
RELEASE_MAX_WHEEL_BYTES = env.int("RELEASE_MAX_WHEEL_BYTES", default=50 * 1024 * 1024)
# Each of the two validation processes (pip install, the import probe) is killed after this long.
RELEASE_VALIDATION_TIMEOUT_S = env.float("RELEASE_VALIDATION_TIMEOUT_S", default=120.0)
# Rollouts (docs/releases.md): the canary and wave sizes and the soak of each wave under the health gate are
# defaults a rollout may override; at most RELEASE_ROLLOUT_CONCURRENCY instances of a wave restart at once.
RELEASE_ROLLOUT_CANARY = env.int("RELEASE_ROLLOUT_CANARY", default=1)
RELEASE_ROLLOUT_WAVE_SIZE = env.int("RELEASE_ROLLOUT_WAVE_SIZE", default=10)
RELEASE_ROLLOUT_SOAK_S = env.int("RELEASE_ROLLOUT_SOAK_S", default=60)
RELEASE_ROLLOUT_CONCURRENCY = env.int("RELEASE_ROLLOUT_CONCURRENCY", default=5)
# How often the gate looks at a soaking wave, and when an effect's intent counts as in doubt (a step that
# records an intent settles it within its own run; one still open this long after is not settling).
RELEASE_GATE_POLL_S = env.float("RELEASE_GATE_POLL_S", default=2.0)
RELEASE_GATE_IN_DOUBT_AFTER_S = env.float("RELEASE_GATE_IN_DOUBT_AFTER_S", default=60.0)
# A working rollout whose record has not moved for this long is queued again by beat (a killed worker).
RELEASE_ROLLOUT_STALL_AFTER_S = env.float("RELEASE_ROLLOUT_STALL_AFTER_S", default=120.0)
# Multipart parts above this size are spooled to a temporary file, never held in memory.
FILE_UPLOAD_MAX_MEMORY_SIZE = env.int("FILE_UPLOAD_MAX_MEMORY_SIZE", default=2_621_440)

# --- Events and webhooks (issue 17): docs/webhooks.md
INSTALLED_APPS += ["webhooks"]
# Plain-http endpoint URLs, and URLs resolving to loopback/private/link-local addresses, are for development
# and tests only (SSRF: the control plane sits next to the database, the broker and cluster services).
WEBHOOK_ALLOW_HTTP = env.bool("WEBHOOK_ALLOW_HTTP", default=DEBUG)
WEBHOOK_ALLOW_PRIVATE_ADDRESSES = env.bool("WEBHOOK_ALLOW_PRIVATE_ADDRESSES", default=DEBUG)
# Per socket operation (connect, send, each read) of one attempt.
WEBHOOK_TIMEOUT_S = env.float("WEBHOOK_TIMEOUT_S", default=10.0)
# Wait before each retry after a failed attempt; once used up (about 8 hours) the delivery is failed and
# its endpoint marked failing. Nothing is dropped: a failed delivery can be replayed.
WEBHOOK_RETRY_SCHEDULE_S = env.list("WEBHOOK_RETRY_SCHEDULE_S", cast=float,
                                    default=[10, 60, 300, 900, 1800, 3600, 7200, 14400])
# The beat sweep re-queues pending deliveries this long past due (their queued message was lost).
WEBHOOK_SWEEP_GRACE_S = env.float("WEBHOOK_SWEEP_GRACE_S", default=30.0)
# Retries up to this far off wait as countdown messages; longer ones are queued by the sweep when due (keep it
# well under the broker's visibility timeout, CELERY_VISIBILITY_TIMEOUT_S, or Redis hands the message out again).
WEBHOOK_COUNTDOWN_MAX_S = env.float("WEBHOOK_COUNTDOWN_MAX_S", default=60.0)
WEBHOOK_MAX_ENDPOINTS = env.int("WEBHOOK_MAX_ENDPOINTS", default=20)
# How long an attempt holds its delivery; a worker that dies mid-request is retried after it. 0: 3 x the
# timeout + 30 s.
WEBHOOK_LEASE_S = env.float("WEBHOOK_LEASE_S", default=0.0)
SPECTACULAR_SETTINGS.setdefault("ENUM_NAME_OVERRIDES", {}).update({
    "WebhookEndpointStatusEnum": "webhooks.choices.EndpointStatus",
    "WebhookDeliveryStatusEnum": "webhooks.choices.DeliveryStatus",
    "RolloutStatusEnum": "releases.choices.RolloutStatus",
    "RolloutItemStatusEnum": "releases.choices.ItemStatus",
})

# --- Security (issue 8): threat model and the test behind each control in docs/security.md.
# DJANGO_ENV=production turns on TLS-only cookies, HSTS and the HTTPS redirect, and refuses to start
# with a development secret (generated SECRET_KEY or key ring), DEBUG, the embedded database or the
# default host list: a misconfigured production process fails loudly at import, never runs weakly.
from .security import production_settings_problems  # noqa: E402

DJANGO_ENV = env.str("DJANGO_ENV", default="development")
PRODUCTION = DJANGO_ENV == "production"
if PRODUCTION:
    _problems = production_settings_problems(
        environ=dict(env.ENVIRON), debug=DEBUG, var_dir=VAR_DIR, kek_provider=VAULT_KEK_PROVIDER,
        broker_url=CELERY_BROKER_URL,
    )
    if _problems:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured("refusing to start with DJANGO_ENV=production: " + "; ".join(_problems))

# TLS terminates at the ingress / load balancer in production. Trust its X-Forwarded-Proto only when
# it is known to set (and strip) the header: TRUST_X_FORWARDED_PROTO=true.
SECURE_TLS = env.bool("SECURE_TLS", default=PRODUCTION)
if env.bool("TRUST_X_FORWARDED_PROTO", default=False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=SECURE_TLS)
# Instances call the internal endpoints over the cluster network (CONTROL_PLANE_INTERNAL_URL is plain
# HTTP inside the cluster, behind a default-deny NetworkPolicy); probes and scrapers use HTTP too.
SECURE_REDIRECT_EXEMPT = [r"^internal/", r"^healthz$", r"^metrics$"]
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=SECURE_TLS)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=SECURE_TLS)
# Forms carry the token in the page (and htmx sends it as X-CSRFToken from the page), so no script
# ever needs to read the cookie.
CSRF_COOKIE_HTTPONLY = True
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
SESSION_COOKIE_AGE = env.int("SESSION_COOKIE_AGE", default=12 * 3600)
# HSTS is only ever sent over HTTPS (SecurityMiddleware); one year once TLS is on.
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=31536000 if SECURE_TLS else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=SECURE_TLS)
# Preloading is a per-domain commitment that is slow to undo: opt in explicitly (SECURE_HSTS_PRELOAD=true).
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=False)
SILENCED_SYSTEM_CHECKS = [] if SECURE_HSTS_PRELOAD else ["security.W021"]
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
AUTH_PASSWORD_VALIDATORS += [
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Content-Security-Policy on every response that does not set its own (controlplane.security).
# Scripts and styles are self-hosted (htmx vendored, Swagger UI from drf-spectacular-sidecar); inline
# styles stay allowed for the theme colours and style attributes, inline scripts never are.
CONTENT_SECURITY_POLICY = env.str(
    "CONTENT_SECURITY_POLICY",
    default="default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
            "font-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
            "frame-ancestors 'none'",
)
MIDDLEWARE.insert(MIDDLEWARE.index("django.middleware.security.SecurityMiddleware") + 1,
                  "controlplane.security.ContentSecurityPolicyMiddleware")
# Static files (htmx, styles, Swagger UI) are served by the app itself (WhiteNoise), straight from the
# apps' static directories: nothing to collect into the read-only image, nothing from a CDN.
MIDDLEWARE.insert(MIDDLEWARE.index("controlplane.security.ContentSecurityPolicyMiddleware") + 1,
                  "whitenoise.middleware.WhiteNoiseMiddleware")
MIDDLEWARE.insert(MIDDLEWARE.index("whitenoise.middleware.WhiteNoiseMiddleware") + 1,
                  "controlplane.security.RejectNulBytesMiddleware")
# Cross-origin calls (django-cors-headers), only to the endpoints a customer token opens: an operator's own web
# front end, on one of its domains (Operator.domains, checked per request: conversations.cors), talks to its
# customer's agent with a bearer token. No cookies cross origins (credentials off), nothing else is opened.
INSTALLED_APPS += ["corsheaders"]
MIDDLEWARE.insert(0, "corsheaders.middleware.CorsMiddleware")
CORS_URLS_REGEX = r"^/api/v1/tenants/[^/]+/(threads|tasks|effects|logs)(/.*)?$"
CORS_ALLOWED_ORIGINS = env.list("CORS_ALLOWED_ORIGINS", default=[])
CORS_ALLOW_CREDENTIALS = False
CORS_ALLOW_HEADERS = ("accept", "authorization", "content-type", "idempotency-key", "last-event-id")
CORS_EXPOSE_HEADERS = ("Retry-After", "Location")
CORS_PREFLIGHT_MAX_AGE = 600
WHITENOISE_USE_FINDERS = True
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # WhiteNoise also looks here (empty unless collectstatic ran)
WHITENOISE_AUTOREFRESH = DEBUG
INSTALLED_APPS += ["drf_spectacular_sidecar"]
SPECTACULAR_SETTINGS.update({
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    # Every operation documents its problem+json error responses (controlplane.openapi).
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "controlplane.openapi.add_problem_responses"],
})

# Request size: bodies over DATA_UPLOAD_MAX_MEMORY_SIZE (above) are refused before parsing; form
# fields are capped too. Slow clients are cut off by the web server (deploy/gunicorn.conf.py).
DATA_UPLOAD_MAX_NUMBER_FIELDS = env.int("DATA_UPLOAD_MAX_NUMBER_FIELDS", default=200)

# Throttling: DRF throttles (controlplane.throttles) count per operator (or per instance) in this
# cache, so one operator's burst never uses up another's allowance: CACHE_URL, else the broker's Redis (the
# embedded one by default); local memory only when the broker is no Redis (one process: per-process counts).
_cache_url = env.str("CACHE_URL", default="") or _BROKER_REDIS_URL
CACHES = {
    "default": (
        {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": _cache_url,
         "KEY_PREFIX": env.str("CACHE_KEY_PREFIX", default="cp")}
        if _cache_url else
        {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "controlplane"}
    )
}
REST_FRAMEWORK["DEFAULT_PARSER_CLASSES"] = ["controlplane.parsers.SafeJSONParser"]
REST_FRAMEWORK["DEFAULT_PAGINATION_CLASS"] = "controlplane.pagination.BoundedLimitOffsetPagination"
# OPTIONS is 405 (the schema at /api/schema/ describes every operation; CORS preflights are answered by
# django-cors-headers before any view): DRF's metadata answer needs a serializer per view and said little.
REST_FRAMEWORK["DEFAULT_METADATA_CLASS"] = None
REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"] = {
    # POST /api/v1/tenants, per operator (the tenant quota still caps the total).
    "onboarding": env.str("THROTTLE_ONBOARDING_RATE", default="60/min"),
    # Operator credential API (list, read, put, revoke), per operator.
    "credentials": env.str("THROTTLE_CREDENTIALS_RATE", default="300/min"),
    # Every other operator API call, per operator.
    "operator": env.str("THROTTLE_OPERATOR_RATE", default="1200/min"),
    # Instance credential and object-key delivery, per instance.
    "instance-credentials": env.str("THROTTLE_INSTANCE_CREDENTIALS_RATE", default="600/min"),
}

# --- dashboard history samples (issue 17: charts) ---------------------------------------------------------
# Heartbeat-age and fleet-status samples (dashboard.sampling, every 60 s by beat) older than this are pruned.
DASHBOARD_SAMPLE_RETENTION_DAYS = env.float("DASHBOARD_SAMPLE_RETENTION_DAYS", default=7.0)
