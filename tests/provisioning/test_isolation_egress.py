"""Issue 38: the egress proxy wired into isolated mode, and the hosts a release declares (``Agent(egress=...)``).

The machine's proxy runs as ``manage.py egress_proxy --listen 127.0.0.1:<port>`` (a real process, as supervisord runs
it), every tenant identified by its proxy credential (tenant id : instance token). First without sandboxes: raw
``CONNECT`` requests with and without credentials, and a release uploaded through the API whose agents declare a
host. Then for real: two customers onboarded by a real worker with ``LOCAL_INSTANCE_NETWORK=isolated`` and
``EGRESS_PROXY_ADDRESS`` set; A's instance, in its own network namespace, runs a task whose step fetches an
allow-listed https URL with plain urllib (it goes through the granted path to the proxy, the TLS peer is a test CA's
``localhost``) and succeeds; a host not on its list fails with the proxy's 403, logged for A; B's instance fetching
A's host is refused and logged for B.

The peers listen on 127.0.0.1, so the proxy runs with ``EGRESS_ALLOW_PRIVATE_ADDRESSES`` on (tests only).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from agent_runtime.sdk.agent import EGRESS_HOST_PATTERN as SDK_HOST_PATTERN
from egress.models import EgressDecision, EgressRule
from egress.rules import HOST_PATTERN
from egress.selectors import allow_list_for_tenant
from provisioning.drivers.local_network import relay_dir, stop_relays_in
from provisioning.drivers.local_process import live_host_pid
from provisioning.drivers.local_sandbox import sandbox_support
from provisioning.fleet.instances import instance_submit_task, instance_task_summary
from provisioning.fleet.posture import isolation_posture
from provisioning.resources.spec import tenant_spec
from releases.models import AgentRelease, ReleaseAssignment
from releases.services import EGRESS_HOST_PATTERN as RELEASES_HOST_PATTERN
from tenants.actors import SYSTEM
from tenants.models import Tenant
from tests.conftest import BASE_DIR, SESSION_TMP, kill_session_instances, onboard_ready, subprocess_env, wait_for
from tests.egress.test_egress_proxy import BODY, Peer, _test_ca
from tests.provisioning.test_isolation_network import EXTRA_ENV
from tests.provisioning.test_recovery import WORKER_ENV
from tests.releases.test_releases_upload import make_wheel, upload
from tests.vault.test_vault_helpers import assert_problem, make_instance

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("bwrap") or not shutil.which("socat"),
                       reason="the sandbox needs root, bubblewrap and socat (make system-deps installs them)"),
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class FleetProxy:
    """``manage.py egress_proxy --listen 127.0.0.1:<port>`` without ``--tenant``: what ``make run`` supervises."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "egress_proxy", "--listen", f"127.0.0.1:{self.port}"], cwd=BASE_DIR,
            env=subprocess_env(EGRESS_ALLOW_PRIVATE_ADDRESSES="true", EGRESS_RULES_REFRESH_S="0.2"),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = self.process.stdout.readline() if self.process.stdout else ""
        assert "every tenant" in first and "listening" in first, first
        self.output = ""

    def stop(self) -> str:
        """SIGTERM; everything it printed (stdout and stderr: its log)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        out, err = self.process.communicate(timeout=20)
        assert self.process.returncode == 0, err[-2000:]
        self.output = out + err
        return self.output


@pytest.fixture
def fleet_proxy() -> Iterator[FleetProxy]:
    proxy = FleetProxy()
    try:
        yield proxy
    finally:
        if proxy.process.poll() is None:
            proxy.process.kill()
            proxy.process.communicate(timeout=10)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return _test_ca(tmp_path_factory.mktemp("egress-ca"))


@pytest.fixture
def tls_peer(certs: tuple[Path, Path, Path]) -> Iterator[Peer]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certs[1], certs[2])
    peer = Peer(context)
    yield peer
    peer.server.shutdown()


@pytest.fixture
def http_peer() -> Iterator[Peer]:
    peer = Peer(None)
    yield peer
    peer.server.shutdown()


def _connect(port: int, target: str, credential: tuple[str, str] | None) -> tuple[int, str, socket.socket]:
    """A raw ``CONNECT target`` to the proxy, with ``Proxy-Authorization: Basic`` when given: (status, head, sock)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    auth = ""
    if credential is not None:
        auth = "Proxy-Authorization: Basic " + base64.b64encode(":".join(credential).encode()).decode() + "\r\n"
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth}\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
    text = head.decode("latin-1")
    return int(text.split(" ", 2)[1]), text, sock


def _status(port: int, target: str, credential: tuple[str, str] | None) -> tuple[int, str]:
    status, head, sock = _connect(port, target, credential)
    sock.close()
    return status, head


def _wait_decision(tenant: Tenant, **match: Any) -> EgressDecision:
    return wait_for(lambda: EgressDecision.objects.filter(tenant=tenant, **match).first(), timeout=20,
                    what=f"an egress decision {match} for {tenant.slug}")


@pytest.fixture
def customers(operator) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    op = operator
    a = Tenant.objects.create(operator=op, slug="a", name="A", status="ready")
    b = Tenant.objects.create(operator=op, slug="b", name="B", status="ready")
    return {"op": op, "a": a, "b": b, "a_token": make_instance(a), "b_token": make_instance(b)}


def test_the_fleet_proxy_knows_each_tenant_by_its_instance_token_and_nothing_else(
        customers, fleet_proxy, tls_peer, certs, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    a, b, a_token, b_token = customers["a"], customers["b"], customers["a_token"], customers["b_token"]
    EgressRule.objects.create(operator=customers["op"], tenant=a, host="localhost", port=tls_peer.port)
    target, port = f"localhost:{tls_peer.port}", fleet_proxy.port

    # No credential, A's id with B's token, A's id with a wrong secret, a token alone: 407, and the peer never hears.
    for credential in (None, (str(a.pk), b_token), (str(a.pk), a_token[:-2] + "xx"), (a_token, "x"),
                       (str(b.pk), a_token)):
        status, head = _status(port, target, credential)
        assert status == 407, (credential is None, head)
        assert 'Proxy-Authenticate: Basic realm="egress"' in head
    assert tls_peer.accepted == 0
    # B's own credential opens B's allow-list, not A's: A's host is not on it.
    status, head = _status(port, target, (str(b.pk), b_token))
    assert status == 403 and "X-Egress-Refused: not_listed" in head, head
    assert _wait_decision(b, reason="not_listed").host == "localhost"
    assert tls_peer.accepted == 0

    # A's credential, sent by urllib from HTTPS_PROXY=http://<tenant>:<token>@..., as the instance's environment has it.
    proxy_url = f"http://{a.pk}:{a_token}@127.0.0.1:{port}"
    for name in ("HTTPS_PROXY", "https_proxy"):
        monkeypatch.setenv(name, proxy_url)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    client_tls = ssl.create_default_context(cafile=str(certs[0]))
    with urllib.request.build_opener(urllib.request.HTTPSHandler(context=client_tls)).open(
            f"https://{target}/through-the-fleet", timeout=10) as answer:
        assert answer.read() == BODY
    assert tls_peer.seen[-1]["path"] == "/through-the-fleet"
    assert _wait_decision(a, allowed=True).port == tls_peer.port
    # The refused credentials left no row for A (nobody proved to be A), only its one allowed request.
    assert list(EgressDecision.objects.filter(tenant=a).values_list("allowed", flat=True)) == [True]

    log = fleet_proxy.stop()
    assert "credential refused" in log or "egress_proxy_auth_refused" in log, log[-2000:]
    for secret in (a_token, b_token, proxy_url, base64.b64encode(f"{a.pk}:{a_token}".encode()).decode()):
        assert secret not in log


def test_a_host_the_release_declares_is_allowed_to_its_tenants_only(
        api, customers, fleet_proxy, tmp_path, settings) -> None:  # type: ignore[no-untyped-def]
    settings.RELEASES_ROOT = tmp_path / "releases"
    settings.LOCAL_OBJECTSTORE_ROOT = tmp_path / "objectstore"
    settings.RELEASE_VALIDATION_TIMEOUT_S = 60
    declaring = ('from agent_runtime.sdk import Agent\n'
                 'agent = Agent("caller", egress=["LOCALHOST", "*.Example.com", "api.openai.com"])\n'
                 '@agent.step\ndef call(ctx):\n    return {}\n')
    filename, data = make_wheel("caller-agent", "1.0.0", module=declaring,
                                entry_points="[agent_runtime.agents]\ncaller = caller_agent:agent\n")
    created = upload(api, filename, data)
    assert created.status_code == 201, created.content
    assert created.json()["egress"] == ["*.example.com", "api.openai.com", "localhost"]
    release = AgentRelease.objects.get(pk=created.json()["id"])
    assert release.egress == ["*.example.com", "api.openai.com", "localhost"]

    a, b = customers["a"], customers["b"]
    ReleaseAssignment.objects.update_or_create(tenant=b, defaults={"release": release})
    assert allow_list_for_tenant(tenant_id=b.pk).permits("api.openai.com", 443)
    assert allow_list_for_tenant(tenant_id=b.pk).permits("eu.example.com", 80)
    assert not allow_list_for_tenant(tenant_id=b.pk).permits("api.openai.com", 8443)  # web ports only
    assert not allow_list_for_tenant(tenant_id=a.pk).permits("api.openai.com", 443)
    # Through the running proxy: B (on the release) gets past the allow-list to localhost:443, where nothing of this
    # test listens (a 502, or whatever answers there: never not_listed); A, on no release, is refused by the list.
    status, head = _status(fleet_proxy.port, "localhost:443", (str(b.pk), customers["b_token"]))
    assert "not_listed" not in head and status in (200, 502), head
    status, head = _status(fleet_proxy.port, "localhost:443", (str(a.pk), customers["a_token"]))
    assert status == 403 and "X-Egress-Refused: not_listed" in head, head
    assert _wait_decision(a, reason="not_listed").port == 443


@pytest.mark.parametrize("declared", [["https://api.openai.com"], ["api.openai.com:8443"], ["bad host"],
                                      ["*.com"]])
def test_a_badly_declared_egress_host_refuses_the_upload_naming_it(api, tmp_path, settings, declared) -> None:  # type: ignore[no-untyped-def]
    settings.RELEASES_ROOT = tmp_path / "releases"
    settings.LOCAL_OBJECTSTORE_ROOT = tmp_path / "objectstore"
    settings.RELEASE_VALIDATION_TIMEOUT_S = 60
    module = (f'from agent_runtime.sdk import Agent\nagent = Agent("caller", egress={declared!r})\n'
              '@agent.step\ndef call(ctx):\n    return {}\n')
    filename, data = make_wheel("caller-agent", "1.0.1", module=module,
                                entry_points="[agent_runtime.agents]\ncaller = caller_agent:agent\n")
    problem = assert_problem(upload(api, filename, data), 400)
    assert "egress host" in problem["detail"] and declared[0] in problem["detail"], problem
    assert not AgentRelease.objects.exists()


def test_the_host_pattern_is_the_same_in_the_rules_the_releases_and_the_sdk() -> None:
    assert HOST_PATTERN == RELEASES_HOST_PATTERN == SDK_HOST_PATTERN


# --- for real: isolated instances whose only way out is the machine's proxy -----------------------------------------


@pytest.fixture
def isolated_with_egress(live_server, worker_factory, settings, operator, fleet_proxy) -> Iterator[dict[str, Any]]:  # type: ignore[no-untyped-def]
    ok, why = sandbox_support()
    if not ok:
        pytest.fail(f"this machine cannot sandbox instances: {why}")
    address = f"127.0.0.1:{fleet_proxy.port}"
    settings.LOCAL_INSTANCE_NETWORK = "isolated"
    settings.EGRESS_PROXY_ADDRESS = address  # this process builds instance commands too (submitting a task)
    settings.VAR_DIR = SESSION_TMP / "var"
    settings.HEARTBEAT_TIMEOUT_S = 120.0
    env = {**WORKER_ENV, "LOCAL_INSTANCE_NETWORK": "isolated", "EGRESS_PROXY_ADDRESS": address,
           "CONTROL_PLANE_INTERNAL_URL": live_server.url, "INSTANCE_EXTRA_ENV": json.dumps(EXTRA_ENV),
           "LOCAL_EXIT_NOTICE": "true", "HEARTBEAT_TIMEOUT_S": "120"}
    worker = worker_factory(**env)
    tenants: dict[str, Tenant] = {}
    try:
        try:
            for name in ("a", "b"):
                tenants[name] = onboard_ready(operator, f"egr-{name}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{worker.log()[-4000:]}") from None
        yield {**tenants, "proxy": fleet_proxy, "operator": operator}
    finally:
        worker.stop()
        kill_session_instances()
        for net in (Path(settings.VAR_DIR) / "net").glob("*"):
            stop_relays_in(net)


def _settled(tenant: Tenant, count: int) -> dict[str, int]:
    """The tenant's task counts once ``count`` tasks are no longer pending or running."""
    def settled() -> dict[str, int] | None:
        tasks = instance_task_summary(tenant=tenant)["tasks"]
        busy = sum(n for status, n in tasks.items() if status in ("pending", "running", "queued"))
        return tasks if sum(tasks.values()) >= count and not busy else None

    return wait_for(settled, timeout=90, what=f"{count} tasks of {tenant.slug} finished")  # type: ignore[no-any-return]


def test_an_isolated_instance_reaches_an_allowed_host_through_the_proxy_and_nothing_else(
        isolated_with_egress, tls_peer, http_peer, certs) -> None:  # type: ignore[no-untyped-def]
    a, b, proxy = isolated_with_egress["a"], isolated_with_egress["b"], isolated_with_egress["proxy"]
    EgressRule.objects.create(operator=isolated_with_egress["operator"], tenant=a, host="localhost",
                              port=tls_peer.port, note="the model provider")
    host = live_host_pid(tenant_spec(a, with_secrets=("db_password", "object_key_b64", "instance_token")))
    assert host is not None
    env = psutil.Process(host).environ()
    # The proxy's address is the instance's own loopback end of its egress grant; the internal API stays direct.
    assert env["HTTPS_PROXY"].endswith(f"@127.0.0.1:{proxy.port}") and env["HTTPS_PROXY"] == env["HTTP_PROXY"]
    assert env["HTTPS_PROXY"].startswith(f"http://{a.pk}:") and env["NO_PROXY"] == "127.0.0.1"
    assert f"{proxy.port}=/run/agent-net/egress.sock" in env["AGENT_NET_FORWARDS"]
    assert (relay_dir(a.resource_name) / "egress.sock").exists()
    # The posture names the proxy's address, never a credential.
    network = next(line for line in isolation_posture() if line.boundary == "network")
    assert f"egress proxy at 127.0.0.1:{proxy.port}" in network.detail, network
    assert env["AGENT_INSTANCE_TOKEN"] not in str(network) and "@" not in str(network)

    cadata = certs[0].read_text()
    instance_submit_task(tenant=a, kind="fetcher", actor=SYSTEM,
                         params={"url": f"https://localhost:{tls_peer.port}/from-inside", "cadata": cadata})
    assert _settled(a, 1).get("done") == 1
    assert [seen["path"] for seen in tls_peer.seen] == ["/from-inside"]
    allowed = _wait_decision(a, allowed=True)
    assert (allowed.kind, allowed.host, allowed.port) == ("CONNECT", "localhost", tls_peer.port)

    # Not on A's list (another port of the same name): the proxy's 403 fails the step; logged for A; never reached.
    instance_submit_task(tenant=a, kind="fetcher", actor=SYSTEM,
                         params={"url": f"http://localhost:{http_peer.port}/not-listed"})
    refused = _wait_decision(a, reason="not_listed")
    assert (refused.kind, refused.port, refused.allowed) == ("HTTP", http_peer.port, False)
    assert _settled(a, 2).get("done") == 1 and http_peer.accepted == 0

    # B's instance asks for A's host with its own credential: B's list applies, refused, logged for B.
    instance_submit_task(tenant=b, kind="fetcher", actor=SYSTEM,
                         params={"url": f"https://localhost:{tls_peer.port}/as-b", "cadata": cadata})
    assert _wait_decision(b, reason="not_listed").port == tls_peer.port
    assert _settled(b, 1).get("done", 0) == 0
    assert [seen["path"] for seen in tls_peer.seen] == ["/from-inside"]
    time.sleep(0.2)
    assert EgressDecision.objects.filter(tenant=a).count() == 2
