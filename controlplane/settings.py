"""Settings: every environment variable is declared once in ``config_table`` and read here with django-environ.

Nothing here has a production secret baked in: with no environment at all the project runs on one machine
(embedded PostgreSQL, embedded Redis as the broker, local drivers, a development key ring generated under
``var/``). Production sets ``DATABASE_URL``, ``CELERY_BROKER_URL``, ``SECRET_KEY`` and ``VAULT_KEK_KEYRING``.
The names, types, defaults and meanings live in ``controlplane/config_table.py`` (``manage.py settings`` prints
them); this module only says how the values combine. Each Django setting is assembled once, in one section.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import environ
from django.core.exceptions import ImproperlyConfigured

from . import config_table as _config
from .secretfiles import DEV_SECRET_KEY_FILE, dev_secret

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False) if (BASE_DIR / ".env").exists() else None


def _read(name: str, default: Any = _config.COMPUTED) -> Any:
    """The declared setting ``name`` from the environment (KeyError for an undeclared name: declare it first)."""
    return _config.SETTINGS[name].read(env, default)


# --- Core ------------------------------------------------------------------------------------------------------
VAR_DIR = Path(_read("CONTROLPLANE_VAR_DIR", default=str(BASE_DIR / "var"))).resolve()
VAR_DIR.mkdir(parents=True, exist_ok=True)
DJANGO_ENV = _read("DJANGO_ENV")
PRODUCTION = DJANGO_ENV == "production"
DEBUG = _read("DEBUG")
# Generated once per var/ directory (never committed), so a demo needs no setup. Created atomically
# (controlplane.secretfiles): processes starting together all end up with the same key.
SECRET_KEY = _read("SECRET_KEY") or dev_secret(VAR_DIR, DEV_SECRET_KEY_FILE)
_SERVED_HOSTS = _read("ALLOWED_HOSTS")
# Hosts that serve the staff dashboard, the API and the admin (same matching rules as ALLOWED_HOSTS). Every other
# host is an operator portal host, resolved through Operator.domains; an unknown one gets 404.
CONTROL_PLANE_HOSTS = _read("CONTROL_PLANE_HOSTS",
                            default=[h for h in _SERVED_HOSTS if h and not h.startswith(".") and h != "*"])
# Portal host names (Operator.domains) must also pass ALLOWED_HOSTS: ".portal.example.com" allows a whole zone.
# The default allows *.localhost, which only ever resolves to this machine.
ALLOWED_HOSTS = [*_SERVED_HOSTS, *_read("PORTAL_ALLOWED_HOSTS")]

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
    # ours
    "controlplane.leases",
    "tenants",
    "vault",
    "provisioning",
    "instances",
    "conversations",
    "dashboard",
    "portal",
    "branding",
    "releases",
    "webhooks",
    "usage",
    "connections",
    "schedules",
    "mcp_servers",
    "egress",
    # after ours: their templates and static files never shadow ours
    "corsheaders",
    "drf_spectacular_sidecar",
]

MIDDLEWARE = [
    # Work that only records what a request did (a message's settle) runs after its answer is sent.
    "controlplane.after_response.AfterResponseMiddleware",
    # Cross-origin calls (django-cors-headers), only to the endpoints a customer token opens: answered first.
    "corsheaders.middleware.CorsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "controlplane.security.ContentSecurityPolicyMiddleware",
    # Static files (htmx, styles, Swagger UI) are served by the app itself, straight from the apps' static
    # directories: nothing to collect into the read-only image, nothing from a CDN.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "controlplane.security.RejectNulBytesMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    # Operator hosts get the portal's URL map; must run before URL resolution (and CommonMiddleware's slash check).
    "portal.middleware.OperatorHostMiddleware",
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
                "portal.context_processors.portal_context",
            ],
        },
    },
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "dashboard:login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # WhiteNoise also looks here (empty unless collectstatic ran)
WHITENOISE_USE_FINDERS = True
# Files served at the site's root: /favicon.ico, which a browser asks for on a page without a <link rel="icon">
# (the API's JSON, Swagger UI); our pages link the SVG in dashboard/static/ui/ (templates/ui/base.html).
WHITENOISE_ROOT = BASE_DIR / "controlplane" / "root_files"
WHITENOISE_AUTOREFRESH = DEBUG

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": _read("LOG_LEVEL")},
    "loggers": {"django.db.backends": {"level": "WARNING"}, "pgserver": {"level": "WARNING"}},
}

# --- Database: DATABASE_URL, or the embedded PostgreSQL (pgserver) when unset ------------------------------------
if _read("DATABASE_URL"):
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
EMBEDDED_PGBOUNCER = _read("EMBEDDED_PGBOUNCER")
_EMBEDDED_POOLER_URL = ""
if EMBEDDED_PGBOUNCER and EMBEDDED_POSTGRES and not _read("TENANT_DATABASE_URL"):
    from .pgbouncer import embedded_pgbouncer

    try:
        _EMBEDDED_POOLER_URL = (f"host=127.0.0.1 port={embedded_pgbouncer(VAR_DIR / 'pgbouncer', _embedded)}"
                                f" dbname={TENANT_DATABASE}")
    except RuntimeError as _exc:  # not installed, or it did not start: direct connections, said once per process
        print(f"EMBEDDED_PGBOUNCER: {_exc}; instances connect to PostgreSQL directly", file=sys.stderr)
# Persistent connections save a connect per request under gunicorn's threads (production: 60). 0 for runserver,
# which starts a thread per request and would leave one connection behind per request.
DATABASES["default"].setdefault("CONN_MAX_AGE", _read("DB_CONN_MAX_AGE"))
DATABASES["default"].setdefault("CONN_HEALTH_CHECKS", True)
# The same backend with a health check that sends no `SELECT 1` while the connection looks healthy (controlplane/db).
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    DATABASES["default"]["ENGINE"] = "controlplane.db"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# Database that holds tenant schemas: the control plane's own unless set; on the embedded default the
# database "tenants" on the embedded server, reached over 127.0.0.1 (the instances' sandbox hides var/).
TENANT_DATABASE_URL = _read("TENANT_DATABASE_URL") or _EMBEDDED_TENANT_DATABASE_URL
# Empty: the record keeps what `manage.py database_servers set default --pooler` gave it.
TENANT_DATABASE_POOLER_URL = _read("TENANT_DATABASE_POOLER_URL") or _EMBEDDED_POOLER_URL
# The product owns that server: provisioning also takes CONNECT on its other databases away from PUBLIC.
TENANT_DATABASE_EMBEDDED = TENANT_DATABASE_URL == _EMBEDDED_TENANT_DATABASE_URL != ""
# Never in production (controlplane.security): the database resource records "auth": "insecure-override".
TENANT_DATABASE_ALLOW_INSECURE_AUTH = _read("TENANT_DATABASE_ALLOW_INSECURE_AUTH")
TENANT_NAME_PREFIX = _read("TENANT_NAME_PREFIX")

# --- Broker and cache ------------------------------------------------------------------------------------------
# CELERY_BROKER_URL, or the embedded Redis (controlplane/embedded_redis.py: var/redis, a unix socket and a
# generated password) when unset. The heartbeats and the cache default to the broker's Redis too.
CELERY_BROKER_URL = _read("CELERY_BROKER_URL")
EMBEDDED_REDIS = not CELERY_BROKER_URL
_BROKER_REDIS_URL = ""  # the broker's Redis as redis-py spells it; empty when the broker is no Redis
if EMBEDDED_REDIS:
    from .embedded_redis import embedded_redis

    try:
        _embedded_redis = embedded_redis(VAR_DIR / "redis")
    except RuntimeError as _exc:  # one sentence (manage.py prints it as such), not a traceback
        raise ImproperlyConfigured(str(_exc)) from _exc
    CELERY_BROKER_URL = _embedded_redis.broker_url
    _BROKER_REDIS_URL = _embedded_redis.client_url
elif CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
    _BROKER_REDIS_URL = CELERY_BROKER_URL
# A dead worker's unacked messages go back to the queue when a live worker's restore sweep finds them older than
# the visibility timeout. kombu 5.7 sweeps every 10 s but scans Redis only every 10th time (~100 s), which would
# add up to 100 s to every redelivery; here it scans on every sweep, every min(10 s, half the timeout).
_VISIBILITY_TIMEOUT_S = _read("CELERY_VISIBILITY_TIMEOUT_S")
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": _VISIBILITY_TIMEOUT_S,
    "unacked_restore_interval": max(1, min(10, _VISIBILITY_TIMEOUT_S // 2)),
    "unacked_restore_throttle": 1,
}
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
# Several beats may run; the one holding the lease "beat" sends (controlplane/leases; LEADER_LEASE_S).
CELERY_BEAT_SCHEDULER = "controlplane.leases.beat:LeaderScheduler"
LEADER_LEASE_S = _read("LEADER_LEASE_S")
LEADER_RENEW_S = _read("LEADER_RENEW_S")
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_TASK_DEFAULT_QUEUE = _read("CELERY_TASK_DEFAULT_QUEUE")
# Throttling: DRF throttles (controlplane.throttles) count per operator (or per instance) in this cache, so one
# operator's burst never uses up another's allowance: CACHE_URL, else the broker's Redis (the embedded one by
# default); local memory only when the broker is no Redis (one process: per-process counts).
_cache_url = _read("CACHE_URL") or _BROKER_REDIS_URL
CACHES = {
    "default": (
        {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": _cache_url,
         "KEY_PREFIX": _read("CACHE_KEY_PREFIX")}
        if _cache_url else
        {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "controlplane"}
    )
}

# --- REST API --------------------------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["conversations.api.authentication.OperatorEndpointAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["tenants.api.permissions.IsOperator"],
    "DEFAULT_PAGINATION_CLASS": "controlplane.pagination.BoundedLimitOffsetPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "controlplane.problems.problem_exception_handler",
    "DEFAULT_PARSER_CLASSES": ["controlplane.parsers.SafeJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "UNAUTHENTICATED_USER": None,
    # OPTIONS is 405 (the schema at /api/schema/ describes every operation; CORS preflights are answered by
    # django-cors-headers before any view): DRF's metadata answer needs a serializer per view and said little.
    "DEFAULT_METADATA_CLASS": None,
    "DEFAULT_THROTTLE_RATES": {
        "onboarding": _read("THROTTLE_ONBOARDING_RATE"),
        "credentials": _read("THROTTLE_CREDENTIALS_RATE"),
        "operator": _read("THROTTLE_OPERATOR_RATE"),
        "instance-credentials": _read("THROTTLE_INSTANCE_CREDENTIALS_RATE"),
    },
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
    "ENUM_NAME_OVERRIDES": {
        "WebhookEndpointStatusEnum": "webhooks.choices.EndpointStatus",
        "WebhookDeliveryStatusEnum": "webhooks.choices.DeliveryStatus",
        "RolloutStatusEnum": "releases.choices.RolloutStatus",
        "RolloutItemStatusEnum": "releases.choices.ItemStatus",
    },
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    # Every operation documents its problem+json error responses (controlplane.openapi).
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "controlplane.openapi.add_problem_responses"],
}
# Request size: oversized bodies are refused before parsing (400 problem+json through the handler); form fields
# are capped too; slow clients are cut off by the web server (deploy/gunicorn.conf.py).
DATA_UPLOAD_MAX_MEMORY_SIZE = _read("DATA_UPLOAD_MAX_MEMORY_SIZE")
DATA_UPLOAD_MAX_NUMBER_FIELDS = _read("DATA_UPLOAD_MAX_NUMBER_FIELDS")
FILE_UPLOAD_MAX_MEMORY_SIZE = _read("FILE_UPLOAD_MAX_MEMORY_SIZE")
# An operator's own web front end, on one of its domains (Operator.domains, checked per request:
# conversations.cors), talks to its customer's agent with a bearer token. No cookies cross origins.
CORS_URLS_REGEX = r"^/api/v1/tenants/[^/]+/(threads|tasks|effects|logs)(/.*)?$"
CORS_ALLOWED_ORIGINS = _read("CORS_ALLOWED_ORIGINS")
CORS_ALLOW_CREDENTIALS = False
CORS_ALLOW_HEADERS = ("accept", "authorization", "content-type", "idempotency-key", "last-event-id")
CORS_EXPOSE_HEADERS = ("Retry-After", "Location")
CORS_PREFLIGHT_MAX_AGE = 600

# --- Provisioning ----------------------------------------------------------------------------------------------
PROVISIONING_PROFILE = _read("PROVISIONING_PROFILE")
PROVISIONING_RUNTIME_DRIVER = _read("PROVISIONING_RUNTIME_DRIVER")
LOCAL_VOLUME_ROOT = Path(_read("LOCAL_VOLUME_ROOT", default=str(VAR_DIR / "volumes"))).resolve()
LOCAL_OBJECTSTORE_ROOT = Path(_read("LOCAL_OBJECTSTORE_ROOT", default=str(VAR_DIR / "objectstore"))).resolve()
# The control plane's own shared objects (release wheels): provisioning/drivers/shared_store.py.
CONTROLPLANE_OBJECTSTORE = _read("CONTROLPLANE_OBJECTSTORE") or "local"
if CONTROLPLANE_OBJECTSTORE not in ("local", "s3"):
    raise ImproperlyConfigured(f"CONTROLPLANE_OBJECTSTORE must be local or s3, not {CONTROLPLANE_OBJECTSTORE!r}")
# One OS user and one bubblewrap sandbox per local instance (provisioning/drivers/local_sandbox.py).
LOCAL_INSTANCE_ISOLATION = _read("LOCAL_INSTANCE_ISOLATION")
LOCAL_INSTANCE_CGROUP_PARENT = _read("LOCAL_INSTANCE_CGROUP_PARENT")
LOCAL_VOLUME_QUOTA = _read("LOCAL_VOLUME_QUOTA")
LOCAL_INSTANCE_UID_BASE = _read("LOCAL_INSTANCE_UID_BASE")
# A network namespace per sandboxed instance (provisioning/drivers/local_network.py): `auto` gives it wherever the
# machine can (provisioning/drivers/local_support.py decides, for the driver and scripts/services.py alike).
LOCAL_INSTANCE_NETWORK = _read("LOCAL_INSTANCE_NETWORK")
if LOCAL_INSTANCE_NETWORK not in ("auto", "shared", "isolated"):
    raise ImproperlyConfigured(
        f"LOCAL_INSTANCE_NETWORK must be auto, shared or isolated, not {LOCAL_INSTANCE_NETWORK!r}")
# Exact loopback ip:port destinations every isolated instance is granted (development: the demo's local peers).
LOCAL_INSTANCE_LOOPBACK_GRANTS = [a.strip() for a in _read("LOCAL_INSTANCE_LOOPBACK_GRANTS") if a.strip()]
for _address in LOCAL_INSTANCE_LOOPBACK_GRANTS:
    if _config.loopback_grant_problem(_address):
        raise ImproperlyConfigured(f"LOCAL_INSTANCE_LOOPBACK_GRANTS: {_config.loopback_grant_problem(_address)}")
LOCAL_INSTANCE_LAUNCH = _read("LOCAL_INSTANCE_LAUNCH")
if LOCAL_INSTANCE_LAUNCH not in ("exec", "fork"):
    raise ImproperlyConfigured(f"LOCAL_INSTANCE_LAUNCH must be exec or fork, not {LOCAL_INSTANCE_LAUNCH!r}")
if LOCAL_VOLUME_QUOTA not in ("auto", "off"):
    raise ImproperlyConfigured(f"LOCAL_VOLUME_QUOTA must be auto or off, not {LOCAL_VOLUME_QUOTA!r}")
if LOCAL_INSTANCE_ISOLATION not in ("auto", "required", "off"):
    raise ImproperlyConfigured(
        f"LOCAL_INSTANCE_ISOLATION must be auto, required or off, not {LOCAL_INSTANCE_ISOLATION!r}")
SCHEMA_ARCHIVE_RETENTION_DAYS = _read("SCHEMA_ARCHIVE_RETENTION_DAYS")
WORKFLOW_STEP_MAX_ATTEMPTS = _read("WORKFLOW_STEP_MAX_ATTEMPTS")
WORKFLOW_RETRY_BACKOFF_S = _read("WORKFLOW_RETRY_BACKOFF_S")
WORKFLOW_STALL_AFTER_S = _read("WORKFLOW_STALL_AFTER_S")
# The one stall time of the job kernel (controlplane/jobs); a kind may name its own setting instead.
JOBS_STALL_AFTER_S = _read("JOBS_STALL_AFTER_S")
RUNTIME_READY_TIMEOUT_S = _read("RUNTIME_READY_TIMEOUT_S")

# --- Instances -------------------------------------------------------------------------------------------------
CONTROL_PLANE_INTERNAL_URL = _read("CONTROL_PLANE_INTERNAL_URL")
RUNTIME_STOP_GRACE_S = _read("RUNTIME_STOP_GRACE_S")
# Scale to zero (provisioning/fleet/sleep.py, docs/operations.md). 15 minutes by default: a conversation's pauses stay
# well inside it, while a fleet of mostly idle customers stops paying two PostgreSQL sessions and a process each.
INSTANCE_IDLE_SUSPEND_S = _read("INSTANCE_IDLE_SUSPEND_S")
# A JSON object of strings when a value holds commas (AGENT_CONFIG is JSON itself); only AGENT_* keys pass.
_instance_extra = _read("INSTANCE_EXTRA_ENV").strip()
INSTANCE_EXTRA_ENV = {k: str(v) for k, v in (json.loads(_instance_extra) if _instance_extra.startswith("{")
                                             else env.dict("INSTANCE_EXTRA_ENV", default={})).items()
                      if k.startswith("AGENT_")}
# Traces: every instance also exports its spans to this OTLP/HTTP collector (docs/observability.md).
INSTANCE_OTLP_ENDPOINT = _read("INSTANCE_OTLP_ENDPOINT")

# --- Recovery and health (issue 6) ---------------------------------------------------------------------------
# Heartbeats go to Redis when there is one (the broker's unless set); otherwise to PostgreSQL.
HEARTBEAT_REDIS_URL = _read("HEARTBEAT_REDIS_URL", default=_BROKER_REDIS_URL)
HEARTBEAT_KEY_PREFIX = _read("HEARTBEAT_KEY_PREFIX")
HEARTBEAT_TIMEOUT_S = _read("HEARTBEAT_TIMEOUT_S")
PROGRESS_STALL_TIMEOUT_S = _read("PROGRESS_STALL_TIMEOUT_S")
# The Celery worker and beat each write a heartbeat of their own (controlplane/liveness.py) to the heartbeats'
# Redis; none fresher than the timeout (or an exit the supervisor reported) means that service is down: /readyz
# answers 503 and the staff dashboard's overview turns red with the reason.
SERVICE_HEARTBEAT_INTERVAL_S = _read("SERVICE_HEARTBEAT_INTERVAL_S")
SERVICE_HEARTBEAT_TIMEOUT_S = _read("SERVICE_HEARTBEAT_TIMEOUT_S")
RECOVERY_SWEEP_INTERVAL_S = _read("RECOVERY_SWEEP_INTERVAL_S")
# The process that starts a local instance waits on it and starts its recovery the moment it exits
# (provisioning/recovery/exit_notice.py); `manage.py watch_instances` notices the exit of every local instance, whoever
# started it (provisioning/recovery/local_exit_watch.py); the heartbeat timeout remains for hangs.
LOCAL_EXIT_NOTICE = _read("LOCAL_EXIT_NOTICE")
RECOVERY_BACKOFF_BASE_S = _read("RECOVERY_BACKOFF_BASE_S")
RECOVERY_MAX_FAILURES = _read("RECOVERY_MAX_FAILURES")
RECOVERY_FAILURE_WINDOW_S = _read("RECOVERY_FAILURE_WINDOW_S")
RECOVERY_STOP_GRACE_S = _read("RECOVERY_STOP_GRACE_S")
# A hung instance does not act on SIGTERM (a stopped process never does, a wedged main loop neither), and what
# it committed is durable, so the full grace only delays the recovery.
RECOVERY_HUNG_STOP_GRACE_S = _read("RECOVERY_HUNG_STOP_GRACE_S")
RECOVERY_VERIFY_TIMEOUT_S = _read("RECOVERY_VERIFY_TIMEOUT_S")
ROLLING_RESTART_CONCURRENCY = _read("ROLLING_RESTART_CONCURRENCY")
SCHEMA_BACKUP_INTERVAL_S = _read("SCHEMA_BACKUP_INTERVAL_S")
METRICS_TOKEN = _read("METRICS_TOKEN")

# --- Vault (issue 4): key-encryption keys. "local": a key ring "v1:<base64 32 bytes>,v2:..." (newest encrypts) --
VAULT_KEK_PROVIDER = _read("VAULT_KEK_PROVIDER")
VAULT_KEK_KEYRING = _read("VAULT_KEK_KEYRING")
VAULT_KMS_KEY_ID = _read("VAULT_KMS_KEY_ID")
VAULT_KMS_REGION = _read("VAULT_KMS_REGION") or None
AWS_ENDPOINT_URL = _read("AWS_ENDPOINT_URL") or None
VAULT_ROTATION_STALL_AFTER_S = _read("VAULT_ROTATION_STALL_AFTER_S")
# A reader that fetched a ciphertext just before the retirement can still open it (vault/shredding.py).
VAULT_SHRED_GRACE_S = _read("VAULT_SHRED_GRACE_S")

# --- Kubernetes profile (issue 5): read only by the drivers PROVISIONING_PROFILE=kubernetes selects ------------
# API access: in-cluster service account, else a kubeconfig file (and context), else ~/.kube/config.
KUBERNETES_IN_CLUSTER = _read("KUBERNETES_IN_CLUSTER")
KUBERNETES_KUBECONFIG = _read("KUBERNETES_KUBECONFIG")
KUBERNETES_CONTEXT = _read("KUBERNETES_CONTEXT") or None
KUBERNETES_FIELD_MANAGER = _read("KUBERNETES_FIELD_MANAGER")
KUBERNETES_REQUEST_TIMEOUT_S = _read("KUBERNETES_REQUEST_TIMEOUT_S")
KUBERNETES_NAMESPACE_PREFIX = _read("KUBERNETES_NAMESPACE_PREFIX")
KUBERNETES_AGENT_IMAGE = _read("KUBERNETES_AGENT_IMAGE")
KUBERNETES_IMAGE_PULL_POLICY = _read("KUBERNETES_IMAGE_PULL_POLICY")
KUBERNETES_IMAGE_PULL_SECRET = _read("KUBERNETES_IMAGE_PULL_SECRET")
KUBERNETES_STORAGE_CLASS = _read("KUBERNETES_STORAGE_CLASS")
KUBERNETES_VOLUME_ACCESS_MODE = _read("KUBERNETES_VOLUME_ACCESS_MODE")
KUBERNETES_VOLUME_MOUNT_PATH = _read("KUBERNETES_VOLUME_MOUNT_PATH")
KUBERNETES_AGENT_UID = _read("KUBERNETES_AGENT_UID")
# SIGTERM -> agent-host stops after the current step within AGENT_GRACE_PERIOD_S, then flushes; the
# pod's terminationGracePeriodSeconds adds this margin so the kubelet never SIGKILLs a clean flush.
KUBERNETES_AGENT_GRACE_PERIOD_S = _read("KUBERNETES_AGENT_GRACE_PERIOD_S")
KUBERNETES_FLUSH_MARGIN_S = _read("KUBERNETES_FLUSH_MARGIN_S")
# "Ready" = the StatefulSet reports readyReplicas >= 1 for the current revision (its pod passed /readyz).
KUBERNETES_READY_TIMEOUT_S = _read("KUBERNETES_READY_TIMEOUT_S")
KUBERNETES_READY_POLL_S = _read("KUBERNETES_READY_POLL_S")
KUBERNETES_NAMESPACE_DELETE_TIMEOUT_S = _read("KUBERNETES_NAMESPACE_DELETE_TIMEOUT_S")
# NetworkPolicy egress allows (everything else is denied).
KUBERNETES_CONTROL_PLANE_NAMESPACE = _read("KUBERNETES_CONTROL_PLANE_NAMESPACE")
KUBERNETES_CONTROL_PLANE_POD_LABELS = _read("KUBERNETES_CONTROL_PLANE_POD_LABELS")
KUBERNETES_CONTROL_PLANE_PORT = _read("KUBERNETES_CONTROL_PLANE_PORT")
KUBERNETES_DNS_NAMESPACE = _read("KUBERNETES_DNS_NAMESPACE")
KUBERNETES_DNS_POD_LABELS = _read("KUBERNETES_DNS_POD_LABELS")
KUBERNETES_POSTGRES_CIDRS = _read("KUBERNETES_POSTGRES_CIDRS")
KUBERNETES_POSTGRES_NAMESPACE = _read("KUBERNETES_POSTGRES_NAMESPACE")
KUBERNETES_POSTGRES_PORT = _read("KUBERNETES_POSTGRES_PORT")
KUBERNETES_OBJECTSTORE_CIDRS = _read("KUBERNETES_OBJECTSTORE_CIDRS")
KUBERNETES_OBJECTSTORE_NAMESPACE = _read("KUBERNETES_OBJECTSTORE_NAMESPACE")
KUBERNETES_OBJECTSTORE_PORTS = _read("KUBERNETES_OBJECTSTORE_PORTS")
# Plan -> quotas and per-container resources, overridden per plan by KUBERNETES_PLANS_JSON. The local profile's
# sandboxed instances get the same numbers from the kernel (provisioning/drivers/local_limits.py); ``pids`` is read
# there only (a pod's pid limit is the kubelet's, per node).
KUBERNETES_PLANS = {
    "standard": {
        "cpu_request": "250m", "cpu_limit": "1", "memory_request": "512Mi", "memory_limit": "1Gi",
        "storage": "5Gi", "pids": "512",
    },
    "large": {
        "cpu_request": "1", "cpu_limit": "2", "memory_request": "2Gi", "memory_limit": "4Gi",
        "storage": "50Gi", "pids": "2048",
    },
    **_read("KUBERNETES_PLANS_JSON"),
}

# --- S3 object store (any S3-compatible endpoint): one bucket, prefix tenants/<tenant-id>/ per tenant ----------
S3_BUCKET = _read("S3_BUCKET")
if CONTROLPLANE_OBJECTSTORE == "s3" and not S3_BUCKET:
    raise ImproperlyConfigured("CONTROLPLANE_OBJECTSTORE=s3 needs S3_BUCKET (the control plane's objects go under "
                               "its prefix controlplane/)")
S3_REGION = _read("S3_REGION")
S3_ENDPOINT_URL = _read("S3_ENDPOINT_URL") or None
# The endpoint as instances reach it (in-cluster DNS may differ from the control plane's).
S3_INSTANCE_ENDPOINT_URL = _read("S3_INSTANCE_ENDPOINT_URL") or None
S3_CREATE_BUCKET = _read("S3_CREATE_BUCKET")
S3_ACCESS_KEY_ID = _read("S3_ACCESS_KEY_ID")
S3_SECRET_ACCESS_KEY = _read("S3_SECRET_ACCESS_KEY")
# Token vending: with a role ARN every instance gets STS AssumeRole credentials limited by its prefix-scoped
# session policy. A running instance renews its own before expiry (GET /internal/v1/s3-credentials/<tenant>).
S3_ROLE_ARN = _read("S3_ROLE_ARN")
S3_STS_ENDPOINT_URL = _read("S3_STS_ENDPOINT_URL") or None
S3_CREDENTIALS_DURATION_S = _read("S3_CREDENTIALS_DURATION_S")
S3_ROLE_SESSION_NOT_CHAINED = _read("S3_ROLE_SESSION_NOT_CHAINED")
S3_CREDENTIALS_RENEW_BEFORE_S = _read("S3_CREDENTIALS_RENEW_BEFORE_S")
from .s3_session import session_duration_problem  # noqa: E402

if _s3_session_problem := session_duration_problem(
    duration_s=S3_CREDENTIALS_DURATION_S, renew_before_s=S3_CREDENTIALS_RENEW_BEFORE_S,
    not_chained=S3_ROLE_SESSION_NOT_CHAINED,
):
    raise ImproperlyConfigured(_s3_session_problem)

# --- Dashboard, portal, branding (issue 7) ---------------------------------------------------------------------
DASHBOARD_PAGE_SIZE = _read("DASHBOARD_PAGE_SIZE")
PORTAL_PAGE_SIZE = _read("PORTAL_PAGE_SIZE")
DASHBOARD_HEARTBEAT_STALE_S = _read("DASHBOARD_HEARTBEAT_STALE_S")
DASHBOARD_EFFECT_QUEUE_TENANTS = _read("DASHBOARD_EFFECT_QUEUE_TENANTS")
DASHBOARD_EFFECT_QUEUE_DEADLINE_S = _read("DASHBOARD_EFFECT_QUEUE_DEADLINE_S")
DASHBOARD_SAMPLE_RETENTION_DAYS = _read("DASHBOARD_SAMPLE_RETENTION_DAYS")
# Portal mail (team invitations, password reset) goes through Django's EMAIL_BACKEND. EMAIL_URL configures
# it (smtp+tls://user:password@host:587, consolemail://, ...); unset, mail is written as files under
# var/mail, so a bare machine works and no link with a token ever reaches the process log.
_email = (env.email_url("EMAIL_URL") if _read("EMAIL_URL")
          else {"EMAIL_BACKEND": "django.core.mail.backends.filebased.EmailBackend"})
EMAIL_BACKEND = _email["EMAIL_BACKEND"]
EMAIL_FILE_PATH = _email.get("EMAIL_FILE_PATH") or str(VAR_DIR / "mail")
EMAIL_HOST = _email.get("EMAIL_HOST") or "localhost"
EMAIL_PORT = _email.get("EMAIL_PORT") or 25
EMAIL_HOST_USER = _email.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = _email.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = _email.get("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = _email.get("EMAIL_USE_SSL", False)
EMAIL_TIMEOUT = _read("EMAIL_TIMEOUT")
DEFAULT_FROM_EMAIL = _read("DEFAULT_FROM_EMAIL")
PORTAL_INVITATION_TTL_S = _read("PORTAL_INVITATION_TTL_S")
PASSWORD_RESET_TIMEOUT = _read("PASSWORD_RESET_TIMEOUT")
PORTAL_PASSWORD_RESET_INTERVAL_S = _read("PORTAL_PASSWORD_RESET_INTERVAL_S")
BRANDING_LOGO_MAX_BYTES = _read("BRANDING_LOGO_MAX_BYTES")
BRANDING_LOGO_MAX_PIXELS = _read("BRANDING_LOGO_MAX_PIXELS")
BRANDING_STALL_AFTER_S = _read("BRANDING_STALL_AFTER_S")

# --- Agent releases (issue 14): docs/releases.md ---------------------------------------------------------------
# This machine's cache of release installs (one directory per digest): the wheels themselves live in the object
# store (CONTROLPLANE_OBJECTSTORE), so a wiped cache is filled again on use (releases/store.py).
RELEASES_ROOT = Path(_read("RELEASES_ROOT", default=str(VAR_DIR / "releases"))).resolve()
RELEASE_MAX_WHEEL_BYTES = _read("RELEASE_MAX_WHEEL_BYTES")
RELEASE_VALIDATION_TIMEOUT_S = _read("RELEASE_VALIDATION_TIMEOUT_S")
RELEASE_ROLLOUT_CANARY = _read("RELEASE_ROLLOUT_CANARY")
RELEASE_ROLLOUT_WAVE_SIZE = _read("RELEASE_ROLLOUT_WAVE_SIZE")
RELEASE_ROLLOUT_SOAK_S = _read("RELEASE_ROLLOUT_SOAK_S")
RELEASE_ROLLOUT_CONCURRENCY = _read("RELEASE_ROLLOUT_CONCURRENCY")
RELEASE_GATE_POLL_S = _read("RELEASE_GATE_POLL_S")
RELEASE_RETAINED_PER_TENANT = _read("RELEASE_RETAINED_PER_TENANT")
# A step that records an intent settles it within its own run; one still open this long after is not settling.
RELEASE_GATE_IN_DOUBT_AFTER_S = _read("RELEASE_GATE_IN_DOUBT_AFTER_S")
RELEASE_ROLLOUT_STALL_AFTER_S = _read("RELEASE_ROLLOUT_STALL_AFTER_S")

# --- Connected accounts (issue 33): docs/connections.md --------------------------------------------------------
# Client secrets and customers' tokens travel to the provider's endpoints: https only, save loopback in development.
OAUTH_ALLOW_HTTP_LOOPBACK = _read("OAUTH_ALLOW_HTTP_LOOPBACK", default=DEBUG)
OAUTH_ALLOW_PRIVATE_ADDRESSES = _read("OAUTH_ALLOW_PRIVATE_ADDRESSES", default=DEBUG)
OAUTH_STATE_TTL_S = _read("OAUTH_STATE_TTL_S")
OAUTH_HTTP_TIMEOUT_S = _read("OAUTH_HTTP_TIMEOUT_S")
OAUTH_REFRESH_AHEAD_S = _read("OAUTH_REFRESH_AHEAD_S")
OAUTH_REFRESH_SWEEP_INTERVAL_S = _read("OAUTH_REFRESH_SWEEP_INTERVAL_S")
OAUTH_REFRESH_SWEEP_WINDOW_S = _read("OAUTH_REFRESH_SWEEP_WINDOW_S")
OAUTH_DELIVERY_AUDIT_INTERVAL_S = _read("OAUTH_DELIVERY_AUDIT_INTERVAL_S")

# --- MCP (issue 34): docs/mcp.md ----------------------------------------------------------------------------------
MCP_SERVERS_ALLOW_HTTP = _read("MCP_SERVERS_ALLOW_HTTP", default=DEBUG)
MCP_ENDPOINT_WAIT_S = _read("MCP_ENDPOINT_WAIT_S")

# --- Egress (issue 38): docs/security.md#egress --------------------------------------------------------------------
# Not DEBUG's default like the other SSRF switches: in development too the proxy is the sandbox's only way out.
EGRESS_ALLOW_PRIVATE_ADDRESSES = _read("EGRESS_ALLOW_PRIVATE_ADDRESSES")
EGRESS_MAX_CONNECTIONS = _read("EGRESS_MAX_CONNECTIONS")
EGRESS_MAX_CONNECTIONS_TOTAL = _read("EGRESS_MAX_CONNECTIONS_TOTAL")
EGRESS_PROXY_ADDRESS = _read("EGRESS_PROXY_ADDRESS")
EGRESS_HEADER_TIMEOUT_S = _read("EGRESS_HEADER_TIMEOUT_S")
EGRESS_CONNECT_TIMEOUT_S = _read("EGRESS_CONNECT_TIMEOUT_S")
EGRESS_IDLE_TIMEOUT_S = _read("EGRESS_IDLE_TIMEOUT_S")
EGRESS_MAX_DURATION_S = _read("EGRESS_MAX_DURATION_S")
EGRESS_RULES_REFRESH_S = _read("EGRESS_RULES_REFRESH_S")
EGRESS_MAX_RULES_PER_OPERATOR = _read("EGRESS_MAX_RULES_PER_OPERATOR")
EGRESS_LOG_KEEP_PER_TENANT = _read("EGRESS_LOG_KEEP_PER_TENANT")

# --- Events and webhooks (issue 17): docs/webhooks.md ----------------------------------------------------------
# SSRF: the control plane sits next to the database, the broker and cluster services.
WEBHOOK_ALLOW_HTTP = _read("WEBHOOK_ALLOW_HTTP", default=DEBUG)
WEBHOOK_ALLOW_PRIVATE_ADDRESSES = _read("WEBHOOK_ALLOW_PRIVATE_ADDRESSES", default=DEBUG)
WEBHOOK_TIMEOUT_S = _read("WEBHOOK_TIMEOUT_S")
# Nothing is dropped once the schedule is used up: a failed delivery can be replayed.
WEBHOOK_RETRY_SCHEDULE_S = _read("WEBHOOK_RETRY_SCHEDULE_S")
WEBHOOK_SWEEP_GRACE_S = _read("WEBHOOK_SWEEP_GRACE_S")
# Keep it well under the broker's visibility timeout, or Redis hands the countdown message out again.
WEBHOOK_COUNTDOWN_MAX_S = _read("WEBHOOK_COUNTDOWN_MAX_S")
WEBHOOK_MAX_ENDPOINTS = _read("WEBHOOK_MAX_ENDPOINTS")
# A worker that dies mid-request is retried after it.
WEBHOOK_LEASE_S = _read("WEBHOOK_LEASE_S")
# The delivery log keeps this much of each receiver answer (webhooks/targets.py).
WEBHOOK_LOG_RESPONSE_BYTES = _read("WEBHOOK_LOG_RESPONSE_BYTES")
# Task outcomes and replies are read from the instances by the webhooks sweep (webhooks/runtime_events.py).
WEBHOOK_RUNTIME_EVENTS = _read("WEBHOOK_RUNTIME_EVENTS")

# --- Usage per customer (issue 37): UsageDay rows collected from the instances (usage/services.py) --------------
USAGE_COLLECT_INTERVAL_S = _read("USAGE_COLLECT_INTERVAL_S")  # the beat job's interval (controlplane/periodic.py)
# --- Schedules (issue 35): a customer's cron and one-off schedules (docs/schedules.md) ------------------------
SCHEDULES_SWEEP_INTERVAL_S = _read("SCHEDULES_SWEEP_INTERVAL_S")  # the beat job's interval (controlplane/periodic.py)
SCHEDULES_MISFIRE_GRACE_S = _read("SCHEDULES_MISFIRE_GRACE_S")

# --- Fault injection (tests only) ------------------------------------------------------------------------------
# Pauses at the worst moment of a job so a chaos test can SIGKILL the worker there. Zero unless the test-only
# switch CONTROLPLANE_FAULT_INJECTION is on; production refuses the switch and every knob (below).
# Production lists them with everything else it refuses (below).
CONTROLPLANE_FAULT_INJECTION = _read("CONTROLPLANE_FAULT_INJECTION")  # controlplane.jobs.job_pause checks it again
if not PRODUCTION and not CONTROLPLANE_FAULT_INJECTION and (
        _fault_problems := _config.fault_injection_problems(env.ENVIRON, production=False)):
    raise ImproperlyConfigured("; ".join(_fault_problems))
PROVISIONING_PAUSE_AFTER_EFFECT_S = _read("PROVISIONING_PAUSE_AFTER_EFFECT_S")
PROVISIONING_PAUSE_STEP = _read("PROVISIONING_PAUSE_STEP")  # empty: every step
VAULT_ROTATION_PAUSE_PER_ITEM_S = _read("VAULT_ROTATION_PAUSE_PER_ITEM_S")
BRANDING_ROLLOUT_PAUSE_PER_ITEM_S = _read("BRANDING_ROLLOUT_PAUSE_PER_ITEM_S")
SCHEDULES_PAUSE_S = _read("SCHEDULES_PAUSE_S")  # schedules.sweep.fault_pause checks the switch again
SCHEDULES_PAUSE_AT = _read("SCHEDULES_PAUSE_AT")

# --- Security (issue 8): threat model and the test behind each control in docs/security.md ---------------------
# DJANGO_ENV=production turns on TLS-only cookies, HSTS and the HTTPS redirect, and refuses to start
# with a development secret (generated SECRET_KEY or key ring), DEBUG, the embedded database, the
# default host list or a fault-injection setting: a misconfigured production process fails loudly at import.
from .security import production_settings_problems  # noqa: E402

if PRODUCTION and (_problems := production_settings_problems(
    environ=dict(env.ENVIRON), debug=DEBUG, var_dir=VAR_DIR, kek_provider=VAULT_KEK_PROVIDER,
    broker_url=CELERY_BROKER_URL,
)):
    raise ImproperlyConfigured("refusing to start with DJANGO_ENV=production: " + "; ".join(_problems))

# TLS terminates at the ingress / load balancer in production. Trust its X-Forwarded-Proto only when
# it is known to set (and strip) the header: TRUST_X_FORWARDED_PROTO=true.
SECURE_TLS = _read("SECURE_TLS", default=PRODUCTION)
if _read("TRUST_X_FORWARDED_PROTO"):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = _read("SECURE_SSL_REDIRECT", default=SECURE_TLS)
# Instances call the internal endpoints over the cluster network (CONTROL_PLANE_INTERNAL_URL is plain
# HTTP inside the cluster, behind a default-deny NetworkPolicy); probes and scrapers use HTTP too.
SECURE_REDIRECT_EXEMPT = [r"^internal/", r"^healthz$", r"^metrics$"]
SESSION_COOKIE_SECURE = _read("SESSION_COOKIE_SECURE", default=SECURE_TLS)
CSRF_COOKIE_SECURE = _read("CSRF_COOKIE_SECURE", default=SECURE_TLS)
# Forms carry the token in the page (and htmx sends it as X-CSRFToken from the page), so no script
# ever needs to read the cookie.
CSRF_COOKIE_HTTPONLY = True
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
SESSION_COOKIE_AGE = _read("SESSION_COOKIE_AGE")
# HSTS is only ever sent over HTTPS (SecurityMiddleware); one year once TLS is on.
SECURE_HSTS_SECONDS = _read("SECURE_HSTS_SECONDS", default=31536000 if SECURE_TLS else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = _read("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=SECURE_TLS)
# Preloading is a per-domain commitment that is slow to undo: opt in explicitly (SECURE_HSTS_PRELOAD=true).
SECURE_HSTS_PRELOAD = _read("SECURE_HSTS_PRELOAD")
SILENCED_SYSTEM_CHECKS = [] if SECURE_HSTS_PRELOAD else ["security.W021"]
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
# Content-Security-Policy on every response that does not set its own (controlplane.security).
# Scripts and styles are self-hosted (htmx vendored, Swagger UI from drf-spectacular-sidecar); inline
# styles stay allowed for the theme colours and style attributes, inline scripts never are.
CONTENT_SECURITY_POLICY = _read("CONTENT_SECURITY_POLICY")
