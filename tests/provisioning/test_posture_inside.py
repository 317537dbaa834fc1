"""The isolation posture probed from inside a real sandbox (issue 38): what an instance actually reaches.

Every probe here runs ``provisioning.fleet.posture_inside.PROBE`` in a real bubblewrap sandbox on this machine (a fresh
one as ``nobody``, or tenant A's own, built by ``instance_command`` exactly as A's instance runs) and the assertions
are on what it found: a listener the test opens on loopback, the machine's Redis (no password) and PostgreSQL
(``trust``), a Redis of the test's own with ``requirepass``, tenant B's volume and live host.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from controlplane.ports import free_port, port_answers
from provisioning.drivers.local_process import LocalProcessDriver
from provisioning.drivers.local_sandbox import instance_uid, sandbox_support
from provisioning.fleet.posture_inside import PROBE, inside_posture_lines, lines_from_probe, run_inside_probe
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def sandboxing() -> None:
    ok, why = sandbox_support()
    if not ok:
        pytest.skip(f"this machine cannot sandbox instances: {why}")


def _lines(found: dict[str, Any]) -> dict[str, Any]:
    return {line.boundary: line for line in lines_from_probe(found)}


def test_a_loopback_listener_is_reachable_from_inside_and_a_closed_one_is_not(sandboxing) -> None:  # type: ignore[no-untyped-def]
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    try:
        found = run_inside_probe()
    finally:
        listener.close()
    assert found["uid"] == 65534, found  # nobody, not the control plane's root
    assert found["reachable"].get(str(port)) == "127.0.0.1", found["reachable"]
    assert str(port) in _lines(found)["loopback services (inside)"].detail
    assert str(port) not in run_inside_probe()["reachable"]


def test_the_machines_open_redis_and_trusting_postgresql_fail_from_inside(sandboxing) -> None:  # type: ignore[no-untyped-def]
    if not port_answers(6379) or not port_answers(5432):
        pytest.skip("needs the machine's Redis on 6379 and PostgreSQL on 5432")
    found = run_inside_probe()
    lines = _lines(found)
    assert found["redis"].get("6379") == "open", found["redis"]
    assert lines["redis auth (inside)"].status == "fail" and "requirepass" in lines["redis auth (inside)"].fix
    assert lines["loopback services (inside)"].status == "fail"
    assert "6379 (Redis)" in lines["loopback services (inside)"].detail
    assert "5432 (PostgreSQL)" in lines["loopback services (inside)"].detail
    # The CI machine's server trusts local logins (docs/security.md, known limits): the probe logs in as postgres.
    assert found["postgres"]["5432"]["postgres"] == "trust", found["postgres"]
    assert lines["database trust (inside)"].status == "fail"
    assert "postgres@5432" in lines["database trust (inside)"].detail


def test_a_redis_with_a_password_passes_from_inside(sandboxing, settings, tmp_path) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--requirepass", secrets.token_urlsafe(16), "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: port_answers(port), timeout=20, what="redis-server with requirepass")
        settings.HEARTBEAT_REDIS_URL = f"redis://127.0.0.1:{port}/0"  # named Redis, so the probe asks it
        found = run_inside_probe()
    finally:
        proc.terminate()
        proc.wait(10)
    assert found["redis"][str(port)] == "auth", found["redis"]
    closed_only = {**found, "redis": {str(port): found["redis"][str(port)]}}
    assert _lines(closed_only)["redis auth (inside)"].status == "pass"


@pytest.fixture
def two_tenants(operator, settings, sandboxing) -> Iterator[tuple[Any, Any]]:  # type: ignore[no-untyped-def]
    """A (resources only) and B (its instance running in its sandbox), provisioned step by step."""
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

    tenants = []
    for letter in ("a", "b"):
        tenant, _ = tenant_onboard(operator=operator, slug=f"inside-{letter}", name=f"Customer {letter}",
                                   actor=SYSTEM, allow_no_release=True)
        ctx = StepContext(tenant)
        for step in (step_database, step_volume, step_objectstore, step_vault,
                     *((step_runtime,) if letter == "b" else ())):
            step(ctx)
        tenants.append(tenant)
    yield tenants[0], tenants[1]
    LocalProcessDriver().stop(_spec(tenants[1]), grace_s=10)


def _spec(tenant: Any) -> Any:
    from provisioning.resources.spec import tenant_spec

    return tenant_spec(tenant, with_secrets=("db_password", "object_key_b64", "instance_token"))


def test_inside_a_tenants_own_sandbox_b_is_invisible_and_a_visible_decoy_is_reported(two_tenants) -> None:  # type: ignore[no-untyped-def]
    from provisioning.drivers.local_process import live_host_pid

    a, b = two_tenants
    b_volume = _spec(b).resources["volume"].details["path"]
    b_host = live_host_pid(_spec(b))
    assert b_host and Path(b_volume).is_dir()
    # A decoy another tenant could have left where the sandbox does not hide (the read-only checkout).
    decoy = tempfile.mkdtemp(prefix=".posture-decoy-", dir=settings.BASE_DIR)
    try:
        found = run_inside_probe(spec=_spec(a), foreign_paths=[decoy])
    finally:
        os.rmdir(decoy)
    assert found["uid"] == instance_uid(str(a.pk)) and found["tenant"] == str(a.pk), found
    a_role = _spec(a).resources["database"].details["role"]
    assert all(a_role in roles for roles in found["postgres"].values()), found["postgres"]  # its own role tried too
    assert b_volume not in found["paths"] and str(Path(settings.VAR_DIR) / "secrets") not in found["paths"]
    assert found["paths"] == [decoy], found["paths"]
    assert found["environments"] == [] and all(p["pid"] != b_host for p in found["processes"]), found
    line = _lines(found)["other tenants (inside)"]
    assert line.status == "fail" and decoy in line.detail
    assert _lines({**found, "paths": []})["other tenants (inside)"].status == "pass"
    # The same probe without the sandbox, as root: B's volume and B's environment are right there.
    config = json.dumps({"postgres_ports": [], "redis_ports": [], "roles": [], "foreign_paths": [b_volume]})
    bare = json.loads(subprocess.run([sys.executable, "-I", "-c", PROBE, config], capture_output=True, text=True,
                                     timeout=60, check=True).stdout)
    assert bare["paths"] == [b_volume]
    assert {"pid": b_host, "tenant": str(b.pk)} in bare["environments"], bare["environments"]


def test_the_posture_and_the_command_carry_the_inside_lines(sandboxing) -> None:  # type: ignore[no-untyped-def]
    from provisioning.checks import isolation_posture_check

    lines = {line.boundary: line for line in inside_posture_lines()}
    assert set(lines) == {"loopback services (inside)", "database trust (inside)", "redis auth (inside)",
                          "other tenants (inside)"}
    errors = {m.id for m in isolation_posture_check()}
    for boundary, number in (("loopback services (inside)", 115), ("database trust (inside)", 116),
                             ("redis auth (inside)", 117)):
        if lines[boundary].status == "fail":
            assert f"provisioning.E{number}" in errors, errors
