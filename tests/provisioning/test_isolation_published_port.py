"""Control 3f with real sandboxed instances: the address a local instance publishes is believed only when the kernel
shows that tenant's own host listening on it.

``.host/instance.pid`` and ``.host/http-port`` live in the tenant's volume, owned by its uid: the tenant can rewrite
both. Before, the control plane checked only that the named pid listened on the named port, so tenant A naming the
web server's pid and port sent the control plane's signed call for A's tasks to itself, and naming B's sent it to
B. Here A's files are rewritten as A's uid would, the control plane is asked to call A's instance, and it must
refuse (no connection made), log and audit it; A's own files, put back, must work again.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.signals import request_started

from instances.client import InstanceClient, InstanceUnavailable, forget_tenant
from provisioning.drivers.local_process import PID_FILE, LocalProcessDriver, live_host_pid, published_port
from provisioning.drivers.local_sandbox import sandbox_support
from provisioning.resources.spec import tenant_spec
from provisioning.workflows.onboarding import tenant_onboard
from provisioning.workflows.steps import (
    StepContext,
    step_database,
    step_objectstore,
    step_runtime,
    step_vault,
    step_volume,
)
from tenants.actors import SYSTEM
from tenants.models import AuditLog, Tenant

pytestmark = pytest.mark.django_db(transaction=True)


def _spec(tenant: Tenant):  # type: ignore[no-untyped-def]
    return tenant_spec(tenant, with_secrets=("db_password", "object_key_b64", "instance_token"))


def _host_dir(tenant: Tenant) -> Path:
    return Path(_spec(tenant).resources["volume"].details["path"]) / ".host"


@pytest.fixture
def two_instances(operator) -> Iterator[tuple[Tenant, Tenant]]:  # type: ignore[no-untyped-def]
    """Two customers onboarded by the real steps, each instance running in its own sandbox."""
    ok, why = sandbox_support()
    if not ok:
        pytest.skip(f"this machine cannot sandbox instances: {why}")
    made = []
    for letter in ("a", "b"):
        tenant, _ = tenant_onboard(operator=operator, slug=f"port-{letter}-{secrets.token_hex(3)}",
                                   name=f"Customer {letter}", actor=SYSTEM, allow_no_release=True)
        ctx = StepContext(tenant)
        for step in (step_database, step_volume, step_objectstore, step_vault, step_runtime):
            step(ctx)
        made.append(tenant)
    try:
        yield made[0], made[1]
    finally:
        for tenant in made:
            LocalProcessDriver().stop(_spec(tenant), grace_s=10)


def _rewrite_as_the_tenant(host_dir: Path, *, pid: int, port: int) -> None:
    """What A's uid can do to its own ``.host`` (it owns the directory): replace both files."""
    owner = host_dir.stat()
    for name, value in ((PID_FILE, pid), ("http-port", port)):
        tmp = host_dir / f"{name}.planted"
        tmp.write_text(str(value))
        os.chown(tmp, owner.st_uid, owner.st_gid)
        tmp.replace(host_dir / name)


def _call(tenant: Tenant) -> dict:  # type: ignore[type-arg]
    forget_tenant(str(tenant.pk))
    return InstanceClient(tenant).request_json("GET", "/v1/logs", query={"limit": 1})[1]


def test_a_rewritten_address_naming_the_web_server_or_another_tenant_is_refused_and_audited(
        two_instances, live_server, caplog) -> None:  # type: ignore[no-untyped-def]
    a, b = two_instances
    a_dir, b_dir = _host_dir(a), _host_dir(b)
    a_pid, a_port = int((a_dir / PID_FILE).read_text()), int((a_dir / "http-port").read_text())
    b_pid, b_port = int((b_dir / PID_FILE).read_text()), int((b_dir / "http-port").read_text())
    assert a_dir.stat().st_uid != 0 and a_dir.stat().st_uid != b_dir.stat().st_uid  # sandboxed, own uids
    assert "records" in _call(a)  # A's own address: called (the check lets the real host through)

    # Requests reaching the live server (the control plane's web server, in this process) are counted.
    reached_web: list[object] = []

    def count(sender: object, **kwargs: object) -> None:
        reached_web.append(sender)

    request_started.connect(count)
    try:
        web_port = int(live_server.url.rsplit(":", 1)[1])
        attempts = {
            "web server": (os.getpid(), web_port),
            "tenant B's host": (b_pid, b_port),
            "A's host, B's port": (a_pid, b_port),
            "B's host, A's port": (b_pid, a_port),
        }
        with caplog.at_level("WARNING", logger="provisioning.drivers.local_process"):
            for what, (pid, port) in attempts.items():
                _rewrite_as_the_tenant(a_dir, pid=pid, port=port)
                for _ in range(2):  # twice: audited once per attempt, refused every time
                    with pytest.raises(InstanceUnavailable):
                        _call(a)
                    assert published_port(a_dir, str(a.pk)) is None, what
        assert reached_web == []  # nothing was sent to the web server
    finally:
        request_started.disconnect(count)
    refused = [(r.pid, r.port) for r in caplog.records if getattr(r, "event", "") == "instance_port_refused"]
    assert set(refused) == set(attempts.values())
    audited = AuditLog.objects.filter(action="security.cross_tenant_attempt", tenant=a, data__resource="instance-port")
    assert sorted((r.data["pid"], r.data["port"]) for r in audited) == sorted(attempts.values())
    assert not AuditLog.objects.filter(action="security.cross_tenant_attempt", tenant=b).exists()

    # B never saw a request from the control plane signed for A (its log has no refused signature).
    assert "signature" not in (b_dir / "agent-host.log").read_text(errors="replace").lower()
    # A's files put back: its own host is called again, B still answers its own.
    _rewrite_as_the_tenant(a_dir, pid=a_pid, port=a_port)
    assert "records" in _call(a) and "records" in _call(b)
    assert live_host_pid(_spec(a)) == a_pid


def test_checking_the_port_costs_microseconds_once_verified(two_instances) -> None:  # type: ignore[no-untyped-def]
    """The full check (the sandbox's processes, environments, sockets) runs when a (pid, port) is new; every call
    after that only confirms that the same process still holds the same socket. Both printed; the cached call
    is asserted cheaper than the full one, measured in the same run."""
    from provisioning.drivers import local_process

    a, _b = two_instances
    host_dir, tenant_id = _host_dir(a), str(a.pk)
    started = time.perf_counter()
    for _ in range(10):
        local_process._verified.clear()
        assert published_port(host_dir, tenant_id) is not None
    full_ms = (time.perf_counter() - started) * 1000 / 10
    started = time.perf_counter()
    for _ in range(200):
        assert published_port(host_dir, tenant_id) is not None
    cached_ms = (time.perf_counter() - started) * 1000 / 200
    print(f"published_port: full check {full_ms:.2f} ms, verified {cached_ms:.3f} ms per call")
    assert cached_ms < full_ms / 3


def test_a_verified_port_closed_and_taken_by_another_process_is_refused(two_instances) -> None:  # type: ignore[no-untyped-def]
    """The verification outlives nothing: A's host (verified, then SIGKILLed) leaves its files naming its pid and
    port; another process (this one) listens on that port. The control plane must not call it."""
    import signal
    import socket

    a, _b = two_instances
    a_dir, tenant_id = _host_dir(a), str(a.pk)
    port = published_port(a_dir, tenant_id)
    assert port is not None and published_port(a_dir, tenant_id) == port  # verified, then confirmed
    os.kill(int((a_dir / PID_FILE).read_text()), signal.SIGKILL)
    for _ in range(100):  # the sandbox's children go with the host; the port frees when the last one does
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
                break
            except OSError:
                time.sleep(0.1)
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        assert int((a_dir / "http-port").read_text()) == port  # the files still name the old address
        assert published_port(a_dir, tenant_id) is None


def test_the_posture_has_a_line_for_the_instance_address() -> None:
    from provisioning.fleet.posture import isolation_posture

    line = next(x for x in isolation_posture() if x.boundary == "instance address")
    assert line.status == "pass" and "own host" in line.detail, line
