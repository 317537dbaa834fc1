"""What the features contribute to an agent instance, registered from their ``AppConfig.ready()``.

Provisioning sits below branding, releases and conversations and never imports them; each hands provisioning
what it adds to an instance instead:

- the release source: what the tenant's instance must load (``TenantSpec.release``; releases);
- the release installer: makes a release's install directory on this machine from the control plane's object
  store when it is missing there (a wiped ``var/``, a machine that never saw the upload; releases);
- the agent-config source: the tenant's effective agent configuration, which its instance asks for per task over
  the internal API (``ctx.config``; releases);
- the default release source: what a new customer of an operator would start on (releases): onboarding refuses
  a tenant that would start on no release unless the operator says so (``allow_no_release``);
- runtime start hooks: run by the onboarding's runtime step, ``before`` the spec is built (the tenant's first
  release is recorded) and ``after`` the instance started and its record was written (the operator's branding is
  published);
- the theme source: the operator's current theme document, mounted by the Kubernetes runtime (branding);
- the declared-connections source: the providers the agents of the release a tenant runs declare
  (``Agent(connections=...)``; releases), the only ones the connection delivery hands its instance;
- the MCP server source: the MCP servers registered for the tenant (its operator's and its own; mcp_servers),
  delivered to its instance inside the agent configuration under the reserved key ``mcp``, where the
  configuration's own ``mcp`` entries win by name;
- the connection delivery: a current access token of the tenant's connected account at a provider, which its
  instance asks for over the internal API (``ctx.connections``; connections);
- deprovision hooks: what a feature holds for a tenant outside its resources and must end when the tenant goes
  (connections: its connected accounts, revoked at the providers and their tokens deleted), run by deprovisioning
  before the tenant's keys are retired; each must be idempotent (a killed step runs it again);
- activity sources: durable work a feature holds for tenants in the control plane's tables (the inbox): it keeps
  an instance awake, wakes an asleep one, and is delivered after the wake (conversations).

Nothing registered: no release (and nothing to refuse onboarding for), an empty agent configuration, no
hooks, no theme, no activity (an instance may sleep whenever its own schema is idle). Registration is keyed
by name, so a second ``ready()`` replaces rather than duplicates. No I/O here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from django.db.models import QuerySet

    from tenants.actors import Actor
    from tenants.models import Operator, Tenant

__all__ = ["ActivitySource", "ConnectionDelivery", "connection_delivery", "connection_delivery_register",
           "declared_connections_source_register", "tenant_declared_connections",
           "deprovision_hook_register", "deprovision_hooks_run", "RuntimeStartHook", "activity_source_register",
           "activity_sources",
           "agent_config_source_register", "default_release_source_register", "instance_theme",
           "mcp_server_source_register", "operator_default_release", "release_install", "release_installer_register",
           "release_source_register", "runtime_start_hook_register", "runtime_started", "runtime_starting",
           "tenant_agent_config", "tenant_release",
           "theme_source_register"]


class TenantPrepare(Protocol):
    def __call__(self, *, tenant: Tenant) -> object: ...


class TenantStarted(Protocol):
    def __call__(self, *, tenant: Tenant, driver: Any) -> object: ...


@dataclass(frozen=True)
class RuntimeStartHook:
    """What a feature does when onboarding starts a tenant's instance (either half may be absent)."""

    name: str
    before: TenantPrepare | None = None  # ahead of the spec, so the spec sees what it records
    after: TenantStarted | None = None  # once the instance runs and its record is written; ``driver`` started it


@dataclass(frozen=True)
class ActivitySource:
    """Work a feature holds for tenants in the control plane's own tables. Each query returns the feature's rows
    (each with a ``tenant_id``); provisioning narrows them to the tenants it asks about."""

    name: str  # in the sleeper's reason: "<name> pending or recent"
    waiting: Callable[[], QuerySet[Any]]  # rows waiting for their instance: they keep it awake and wake it
    since: Callable[[datetime], QuerySet[Any]]  # rows accepted at or after the cutoff: recent activity
    oldest_waiting: Callable[[Tenant], datetime | None]  # when the tenant's oldest waiting row was accepted
    # After a wake: deliver what waits; when the first row accepted at or after the cutoff was delivered (if yet).
    deliver: Callable[[Tenant, datetime], datetime | None]


@dataclass(frozen=True)
class ConnectionDelivery:
    """How the internal API hands an instance its own tenant's connected account (the connections app).

    ``deliver(tenant=, provider=, actor=, task=)``: the answer body (provider, access_token, expires_at, ...), raising
    the feature's ApplicationError (404 not connected, 409 needs the customer; ``task``: the asking task's id, whose
    recorded end user picks the connection); ``deliverable(tenant=, provider=, task=)``:
    whether ``deliver`` would answer now, reading and refreshing nothing."""

    name: str
    deliver: Callable[..., dict[str, Any]]
    deliverable: Callable[..., bool]


_connection_delivery: dict[str, ConnectionDelivery] = {}
_deprovision_hooks: dict[str, Callable[..., dict[str, Any]]] = {}
_release_sources: dict[str, Callable[[object], dict[str, str]]] = {}
_agent_config_sources: dict[str, Callable[[Tenant], dict[str, Any]]] = {}
_declared_connections_sources: dict[str, Callable[[Tenant], frozenset[str] | None]] = {}
_mcp_server_sources: dict[str, Callable[[Tenant], dict[str, Any]]] = {}
# The reserved key of an agent configuration the runtime reads its MCP servers from (agent_runtime.mcp.config).
CONFIG_MCP_KEY = "mcp"
_default_release_sources: dict[str, Callable[[Operator], str | None]] = {}
_release_installers: dict[str, Callable[[str], object]] = {}
_theme_sources: dict[str, Callable[[Operator], dict[str, Any] | None]] = {}
_start_hooks: dict[str, RuntimeStartHook] = {}
_activity_sources: dict[str, ActivitySource] = {}


def release_source_register(name: str, source: Callable[[object], dict[str, str]]) -> None:
    """``source(tenant_id)``: what the tenant's instance loads (``TenantSpec.release``); {}: the runtime's agents."""
    _release_sources[name] = source


def release_installer_register(name: str, install: Callable[[str], object]) -> None:
    """``install(digest)``: the release's install directory made on this machine (a ``ProvisioningError`` says
    why it cannot be); called by a runtime driver only when that directory is missing."""
    _release_installers[name] = install


def release_install(digest: str) -> bool:
    """Run the registered installers for ``digest``; False when none is registered (nothing can install it)."""
    for install in _release_installers.values():
        install(digest)
    return bool(_release_installers)


def agent_config_source_register(name: str, source: Callable[[Tenant], dict[str, Any]]) -> None:
    """``source(tenant)``: the tenant's effective agent configuration (credential properties hold names only)."""
    _agent_config_sources[name] = source


def declared_connections_source_register(name: str, source: Callable[[Tenant], frozenset[str] | None]) -> None:
    """``source(tenant)``: the providers the agents the tenant runs declare; None: it runs no release."""
    _declared_connections_sources[name] = source


def tenant_declared_connections(tenant: Tenant) -> frozenset[str] | None:
    """The providers whose connections the tenant's instance may be handed; None when no source declares any
    (no release: the runtime's installed agents, or no releases feature at all)."""
    declared: frozenset[str] | None = None
    for source in _declared_connections_sources.values():
        found = source(tenant)
        if found is not None:
            declared = found if declared is None else declared | found
    return declared


def mcp_server_source_register(name: str, source: Callable[[Tenant], dict[str, Any]]) -> None:
    """``source(tenant)``: the MCP servers registered for the tenant (server name -> the runtime's spec)."""
    _mcp_server_sources[name] = source


def default_release_source_register(name: str, source: Callable[[Operator], str | None]) -> None:
    """``source(operator)``: the version of the release the operator's new customers start on, None if none."""
    _default_release_sources[name] = source


def theme_source_register(name: str, source: Callable[[Operator], dict[str, Any] | None]) -> None:
    """``source(operator)``: the operator's current theme document, None when it has none."""
    _theme_sources[name] = source


def runtime_start_hook_register(hook: RuntimeStartHook) -> None:
    _start_hooks[hook.name] = hook


def connection_delivery_register(delivery: ConnectionDelivery) -> None:
    _connection_delivery[delivery.name] = delivery


def connection_delivery() -> ConnectionDelivery | None:
    """The registered delivery; None when no feature provides connected accounts (the endpoint then 404s)."""
    return next(iter(_connection_delivery.values()), None)


def deprovision_hook_register(name: str, hook: Callable[..., dict[str, Any]]) -> None:
    """``hook(tenant=, actor=)``: end what the feature holds for the tenant; a summary for the step's record."""
    _deprovision_hooks[name] = hook


def deprovision_hooks_run(*, tenant: Tenant, actor: Actor) -> dict[str, Any]:
    return {name: hook(tenant=tenant, actor=actor) for name, hook in _deprovision_hooks.items()}


def activity_source_register(source: ActivitySource) -> None:
    _activity_sources[source.name] = source


def tenant_release(tenant_id: object) -> dict[str, str]:
    release: dict[str, str] = {}
    for source in _release_sources.values():
        release.update(source(tenant_id))
    return release


def tenant_agent_config(tenant: Tenant) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for source in _agent_config_sources.values():
        config.update(source(tenant))
    registered: dict[str, Any] = {}
    for mcp_source in _mcp_server_sources.values():
        registered.update(mcp_source(tenant))
    configured = config.get(CONFIG_MCP_KEY)
    if registered:
        config[CONFIG_MCP_KEY] = {**registered, **(configured if isinstance(configured, dict) else {})}
    return config


def operator_default_release(operator: Operator) -> tuple[bool, str | None]:
    """(whether releases exist at all here, the version the operator's new customers start on or None)."""
    for source in _default_release_sources.values():
        version = source(operator)
        if version is not None:
            return True, version
    return bool(_default_release_sources), None


def instance_theme(operator: Operator) -> dict[str, Any] | None:
    for source in _theme_sources.values():
        theme = source(operator)
        if theme is not None:
            return theme
    return None


def runtime_starting(*, tenant: Tenant) -> None:
    for hook in _start_hooks.values():
        if hook.before is not None:
            hook.before(tenant=tenant)


def runtime_started(*, tenant: Tenant, driver: Any) -> None:
    for hook in _start_hooks.values():
        if hook.after is not None:
            hook.after(tenant=tenant, driver=driver)


def activity_sources() -> list[ActivitySource]:
    return list(_activity_sources.values())
