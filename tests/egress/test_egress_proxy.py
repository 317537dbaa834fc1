"""Issue 38: the egress proxy, with real sockets end to end. A real TLS server (a test CA's certificate for
``localhost``) and a plain-http server are the internet; the proxy runs as a task on its own event loop (and once as
``manage.py egress_proxy``, a real process on a unix socket) and reads its tenant's allow-list from PostgreSQL;
urllib and httpx reach it through HTTPS_PROXY / HTTP_PROXY exactly as an agent's libraries would.

The peers listen on 127.0.0.1, which the proxy refuses by default: tests that need to reach them start it with
``allow_private_addresses=True`` (``EGRESS_ALLOW_PRIVATE_ADDRESSES``, off by default, even in development), the
private-address test with it off.
"""

from __future__ import annotations

import asyncio
import datetime
import http.server
import ipaddress
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from egress.choices import DecisionReason, RequestKind
from egress.models import EgressDecision, EgressRule
from egress.proxy import Decision, ProxyLimits
from egress.runner import limits_from_settings, start_egress_proxy
from egress.services import decision_record
from releases.models import AgentRelease, ReleaseAssignment
from tenants.actors import SYSTEM
from tenants.models import Tenant
from tenants.services import operator_create
from tests.conftest import BASE_DIR, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True)

BODY = b"hello from the internet"


# --- the internet: a TLS server with a test CA, a plain-http server, a peer that never speaks -----------------------

def _test_ca(tmp: Path) -> tuple[Path, Path, Path]:
    """(ca.pem, server cert chain, server key) for ``localhost`` and 127.0.0.1, made with ``cryptography``."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "egress test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = tmp / "ca.pem", tmp / "server.pem", tmp / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


class _Handler(http.server.BaseHTTPRequestHandler):
    seen: list[dict[str, Any]]

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        type(self).seen.append({"path": self.path, "headers": dict(self.headers.items())})
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, *args: Any) -> None:
        pass


class Peer:
    """A threaded HTTP(S) server on 127.0.0.1: what it ``seen`` (path, headers) and how many connections it
    ``accepted`` (a refused request must never reach it)."""

    def __init__(self, tls: ssl.SSLContext | None) -> None:
        self.seen: list[dict[str, Any]] = []
        self.accepted = 0
        peer = self

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def get_request(self) -> tuple[socket.socket, Any]:
                sock, address = self.socket.accept()
                peer.accepted += 1
                return (tls.wrap_socket(sock, server_side=True) if tls else sock), address

        self.server = Server(("127.0.0.1", 0), type("Handler", (_Handler,), {"seen": self.seen}))
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return _test_ca(tmp_path_factory.mktemp("egress-ca"))


@pytest.fixture(scope="module")
def client_tls(certs: tuple[Path, Path, Path]) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(certs[0]))


@pytest.fixture
def tls_peer(certs: tuple[Path, Path, Path]) -> Iterator[Peer]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(certs[1]), str(certs[2]))
    peer = Peer(context)
    yield peer
    peer.server.shutdown()


@pytest.fixture
def http_peer() -> Iterator[Peer]:
    peer = Peer(None)
    yield peer
    peer.server.shutdown()


# --- the proxy: a task on its own loop, in a thread ---------------------------------------------------------------

class RunningProxy:
    def __init__(self, tenant_id: object, listen: Any, limits: ProxyLimits) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server, self.policy = asyncio.run_coroutine_threadsafe(
            start_egress_proxy(tenant_id=tenant_id, listen=listen, limits=limits), self.loop).result(10)
        self.address = self.server.sockets[0].getsockname()

    @property
    def url(self) -> str:
        return f"http://{self.address[0]}:{self.address[1]}"

    def stop(self) -> None:
        async def close() -> None:
            self.server.close()
            await self.server.wait_closed()
            await self.policy.close()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def start_proxy() -> Iterator[Callable[..., RunningProxy]]:
    running: list[RunningProxy] = []

    def start(tenant: Tenant, **limits: Any) -> RunningProxy:
        made = RunningProxy(tenant.pk, ("127.0.0.1", 0), limits_from_settings(**limits))
        running.append(made)
        return made

    yield start
    for proxy in running:
        proxy.stop()


@pytest.fixture
def world() -> dict[str, Any]:
    op_a = operator_create(slug=f"eg-a-{uuid.uuid4().hex[:6]}", name="Egress A", actor=SYSTEM)
    op_b = operator_create(slug=f"eg-b-{uuid.uuid4().hex[:6]}", name="Egress B", actor=SYSTEM)
    return {"op_a": op_a, "op_b": op_b,
            "a": Tenant.objects.create(operator=op_a, slug="a", name="A", status="ready"),
            "a2": Tenant.objects.create(operator=op_a, slug="a2", name="A2", status="ready"),
            "b": Tenant.objects.create(operator=op_b, slug="b", name="B", status="ready")}


@pytest.fixture
def proxy_env(monkeypatch: pytest.MonkeyPatch) -> Callable[[RunningProxy], None]:
    """HTTPS_PROXY / HTTP_PROXY (both spellings) at ``proxy``, and no NO_PROXY exempting localhost."""

    def point(proxy: RunningProxy) -> None:
        for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
            monkeypatch.setenv(name, proxy.url)
        for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.delenv(name, raising=False)

    return point


def _decisions(tenant: Tenant) -> list[EgressDecision]:
    return list(EgressDecision.objects.filter(tenant=tenant).order_by("id"))


def _wait_decisions(tenant: Tenant, count: int) -> list[EgressDecision]:
    """The proxy records after the connection ends: wait for the row (bounded)."""
    deadline = time.monotonic() + 10
    while len(rows := _decisions(tenant)) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return rows


# --- allowed ------------------------------------------------------------------------------------------------------

def test_an_allowed_host_is_reached_through_a_connect_tunnel_by_urllib_and_httpx(
        world, tls_peer, client_tls, start_proxy, proxy_env):
    EgressRule.objects.create(operator=world["op_a"], host="localhost", port=tls_peer.port, note="model provider")
    proxy = start_proxy(world["a"], allow_private_addresses=True)
    proxy_env(proxy)
    url = f"https://localhost:{tls_peer.port}/v1/chat?api_key=sk-secret-in-query"

    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=client_tls))
    with opener.open(url, timeout=10) as answer:
        assert answer.read() == BODY
    with httpx.Client(verify=client_tls, trust_env=True, timeout=10) as client:
        assert client.get(url).content == BODY

    # The TLS was end to end: the server saw the path the client asked for (the proxy never could).
    assert [s["path"] for s in tls_peer.seen] == ["/v1/chat?api_key=sk-secret-in-query"] * 2
    rows = _wait_decisions(world["a"], 2)
    assert [(r.allowed, r.reason, r.kind, r.host, r.port) for r in rows] == [
        (True, "allowed", "CONNECT", "localhost", tls_peer.port)] * 2
    assert all(r.bytes_up > 200 and r.bytes_down > len(BODY) for r in rows)  # TLS handshakes and the answer
    assert not any("sk-secret" in str(vars(r)) or "/v1/chat" in str(vars(r)) for r in rows)


def test_a_plain_http_request_is_forwarded_without_the_proxy_credential_and_logged_without_its_query(
        world, http_peer, start_proxy, proxy_env, monkeypatch):
    EgressRule.objects.create(operator=world["op_a"], tenant=world["a"], host="localhost", port=http_peer.port)
    proxy = start_proxy(world["a"], allow_private_addresses=True)
    proxy_env(proxy)
    # A proxy URL with credentials: urllib sends them as Proxy-Authorization, which must stop at the proxy.
    monkeypatch.setenv("HTTP_PROXY", f"http://agent:proxy-pass-123@{proxy.address[0]}:{proxy.address[1]}")
    monkeypatch.setenv("http_proxy", f"http://agent:proxy-pass-123@{proxy.address[0]}:{proxy.address[1]}")

    url = f"http://localhost:{http_peer.port}/charge?card=4242424242424242"
    with urllib.request.build_opener().open(url, timeout=10) as answer:
        assert answer.read() == BODY
    with httpx.Client(trust_env=True, timeout=10) as client:
        assert client.get(url, headers={"Authorization": "Bearer origin-token"}).content == BODY

    assert [s["path"] for s in http_peer.seen] == ["/charge?card=4242424242424242"] * 2
    for seen in http_peer.seen:
        names = {name.lower() for name in seen["headers"]}
        assert "proxy-authorization" not in names and seen["headers"]["Connection"] == "close"
        assert seen["headers"]["Host"] == f"localhost:{http_peer.port}"
    assert http_peer.seen[1]["headers"]["Authorization"] == "Bearer origin-token"  # the origin's own: passed on
    rows = _wait_decisions(world["a"], 2)
    assert [(r.allowed, r.kind, r.host, r.port) for r in rows] == [(True, "HTTP", "localhost", http_peer.port)] * 2
    assert not any(s in str(vars(r)) for r in rows for s in ("4242", "charge", "proxy-pass", "origin-token"))


# --- refused ------------------------------------------------------------------------------------------------------

def test_a_host_not_on_the_list_is_refused_with_403_and_logged(world, tls_peer, client_tls, start_proxy, proxy_env):
    EgressRule.objects.create(operator=world["op_a"], host="api.model-provider.example")
    proxy = start_proxy(world["a"], allow_private_addresses=True)
    proxy_env(proxy)

    with pytest.raises(OSError, match="403"):
        urllib.request.build_opener(urllib.request.HTTPSHandler(context=client_tls)).open(
            f"https://localhost:{tls_peer.port}/", timeout=10)
    with httpx.Client(verify=client_tls, trust_env=True, timeout=10) as client, pytest.raises(httpx.ProxyError,
                                                                                             match="403"):
        client.get("https://evil.example.net/exfiltrate")
    # A listed name on an unlisted port is another destination.
    with httpx.Client(verify=client_tls, trust_env=True, timeout=10) as client, pytest.raises(httpx.ProxyError,
                                                                                             match="403"):
        client.get("https://api.model-provider.example:8443/")

    assert tls_peer.accepted == 0
    rows = _wait_decisions(world["a"], 3)
    assert [(r.allowed, r.reason, r.host, r.port) for r in rows] == [
        (False, "not_listed", "localhost", tls_peer.port), (False, "not_listed", "evil.example.net", 443),
        (False, "not_listed", "api.model-provider.example", 8443)]


def test_a_private_address_is_refused_even_when_its_name_is_allow_listed(
        world, tls_peer, client_tls, start_proxy, proxy_env):
    EgressRule.objects.create(operator=world["op_a"], host="localhost", port=tls_peer.port)
    EgressRule.objects.create(operator=world["op_a"], host="169.254.169.254")  # cloud metadata, by address
    EgressRule.objects.create(operator=world["op_a"], host="127.0.0.1", port=tls_peer.port)
    proxy = start_proxy(world["a"], allow_private_addresses=False)
    proxy_env(proxy)

    for url in (f"https://localhost:{tls_peer.port}/", f"https://127.0.0.1:{tls_peer.port}/"):
        with pytest.raises(OSError, match="403"):
            urllib.request.build_opener(urllib.request.HTTPSHandler(context=client_tls)).open(url, timeout=10)
    with httpx.Client(trust_env=True, timeout=10) as client:
        answer = client.get("http://169.254.169.254/latest/meta-data/")
    assert answer.status_code == 403 and answer.headers["X-Egress-Refused"] == "private_address"

    assert tls_peer.accepted == 0  # refused before any connection was made
    rows = _wait_decisions(world["a"], 3)
    assert [(r.allowed, r.reason, r.host) for r in rows] == [
        (False, "private_address", "localhost"), (False, "private_address", "127.0.0.1"),
        (False, "private_address", "169.254.169.254")]


def test_another_tenants_and_another_releases_rules_do_not_apply(world, tls_peer, client_tls, start_proxy, proxy_env):
    release = AgentRelease.objects.create(operator=world["op_a"], version="1.0.0", distribution="a-agent",
                                          digest="sha256:" + "0" * 64, filename="a.whl", size_bytes=1,
                                          artifact_key="wheels/a.whl", kinds={"a": ""})
    ReleaseAssignment.objects.create(tenant=world["a2"], release=release)
    # A's sibling customer's own rule, the release A does not run, and another operator's rule for all its customers.
    EgressRule.objects.create(operator=world["op_a"], tenant=world["a2"], host="localhost", port=tls_peer.port)
    EgressRule.objects.create(operator=world["op_a"], release=release, host="localhost", port=tls_peer.port)
    EgressRule.objects.create(operator=world["op_b"], host="localhost", port=tls_peer.port)
    url = f"https://localhost:{tls_peer.port}/"

    proxy_env(start_proxy(world["a"], allow_private_addresses=True))  # urllib reads the variables at build_opener
    with pytest.raises(OSError, match="403"):
        urllib.request.build_opener(urllib.request.HTTPSHandler(context=client_tls)).open(url, timeout=10)
    # The same host is open to the sibling (its own rule and its release's): the rules were real.
    proxy_env(start_proxy(world["a2"], allow_private_addresses=True))
    with urllib.request.build_opener(urllib.request.HTTPSHandler(context=client_tls)).open(url, timeout=10) as ok:
        assert ok.read() == BODY
    EgressRule.objects.filter(tenant=world["a2"]).delete()
    proxy_env(start_proxy(world["a2"], allow_private_addresses=True))  # a fresh proxy: no cached list
    with urllib.request.build_opener(urllib.request.HTTPSHandler(context=client_tls)).open(url, timeout=10) as ok:
        assert ok.read() == BODY  # through the release's rule alone

    assert [(r.allowed, r.reason) for r in _wait_decisions(world["a"], 1)] == [(False, "not_listed")]
    assert [r.allowed for r in _wait_decisions(world["a2"], 2)] == [True, True]
    assert _decisions(world["b"]) == []


# --- bounded ------------------------------------------------------------------------------------------------------

def _raw_connect(proxy: RunningProxy, target: str) -> tuple[socket.socket, bytes]:
    sock = socket.create_connection(proxy.address, timeout=10)
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    return sock, sock.recv(1024)


def _closed_within(sock: socket.socket, seconds: float) -> float:
    """Seconds until the proxy closed ``sock`` (reading b"" or a reset), failing past ``seconds``."""
    started = time.monotonic()
    sock.settimeout(seconds)
    try:
        while sock.recv(1024):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        pytest.fail(f"the proxy kept the connection open past {seconds} s")
    return time.monotonic() - started


def test_a_client_that_never_finishes_its_request_is_cut_at_the_header_timeout(world, start_proxy):
    proxy = start_proxy(world["a"], header_timeout_s=0.5)
    sock = socket.create_connection(proxy.address, timeout=10)
    sock.sendall(b"CONNECT localhost:443 HTTP/1.1\r\nHost: loc")  # and nothing more
    waited = _closed_within(sock, 5)
    assert 0.4 <= waited < 5
    assert _decisions(world["a"]) == []  # no destination was ever requested


def test_an_idle_tunnel_is_cut_at_the_idle_timeout_and_logged_with_its_duration(world, start_proxy):
    silent = socket.create_server(("127.0.0.1", 0))  # a peer that accepts and never speaks
    port = silent.getsockname()[1]
    EgressRule.objects.create(operator=world["op_a"], host="localhost", port=port)
    proxy = start_proxy(world["a"], allow_private_addresses=True, idle_timeout_s=0.6)
    sock, answer = _raw_connect(proxy, f"localhost:{port}")
    assert answer.startswith(b"HTTP/1.1 200")
    peer_side, _ = silent.accept()
    waited = _closed_within(sock, 5)
    assert 0.5 <= waited < 5
    peer_side.settimeout(5)
    assert peer_side.recv(10) == b""  # the peer's side was closed too
    [row] = _wait_decisions(world["a"], 1)
    assert row.allowed and row.duration_ms >= 500 and row.bytes_up == row.bytes_down == 0
    silent.close()


def test_connections_beyond_the_limit_get_a_503(world, start_proxy):
    silent = socket.create_server(("127.0.0.1", 0))
    port = silent.getsockname()[1]
    EgressRule.objects.create(operator=world["op_a"], host="localhost", port=port)
    proxy = start_proxy(world["a"], allow_private_addresses=True, max_connections=1)
    first, answer = _raw_connect(proxy, f"localhost:{port}")
    assert answer.startswith(b"HTTP/1.1 200")
    second, answer = _raw_connect(proxy, f"localhost:{port}")
    assert answer.startswith(b"HTTP/1.1 503")
    first.close()
    second.close()
    silent.close()


def test_an_oversized_request_head_is_refused_not_buffered(world, start_proxy):
    proxy = start_proxy(world["a"])
    sock = socket.create_connection(proxy.address, timeout=10)
    sock.sendall(b"GET http://example.com/ HTTP/1.1\r\nX-Big: " + b"a" * 64 * 1024 + b"\r\n\r\n")
    assert sock.recv(1024).startswith(b"HTTP/1.1 431")


def test_the_log_keeps_the_newest_rows_per_tenant_only(world, settings):
    settings.EGRESS_LOG_KEEP_PER_TENANT = 3
    for port in range(1, 6):
        decision_record(tenant_id=world["a"].pk, decision=Decision(False, DecisionReason.NOT_LISTED,
                                                                   RequestKind.CONNECT, "x.example", port))
    decision_record(tenant_id=world["b"].pk, decision=Decision(True, DecisionReason.ALLOWED, RequestKind.HTTP,
                                                               "y.example", 80))
    assert [r.port for r in _decisions(world["a"])] == [3, 4, 5]
    assert len(_decisions(world["b"])) == 1


# --- as a process, on a unix socket ---------------------------------------------------------------------------------

def test_manage_py_egress_proxy_serves_a_tenant_on_a_unix_socket(world, tls_peer, client_tls, tmp_path):
    EgressRule.objects.create(operator=world["op_a"], host="localhost", port=tls_peer.port)
    path = tmp_path / "egress.sock"
    process = subprocess.Popen(
        [sys.executable, "manage.py", "egress_proxy", "--tenant", str(world["a"].pk), "--listen", str(path)],
        cwd=BASE_DIR, env=subprocess_env(EGRESS_ALLOW_PRIVATE_ADDRESSES="true"), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        assert "listening" in (process.stdout.readline() if process.stdout else "")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        sock.connect(str(path))
        sock.sendall(f"CONNECT localhost:{tls_peer.port} HTTP/1.1\r\n\r\n".encode())
        assert sock.recv(1024).startswith(b"HTTP/1.1 200")
        tls = client_tls.wrap_socket(sock, server_hostname="localhost")
        tls.sendall(b"GET /through-the-socket HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        received = b""
        while chunk := tls.recv(4096):
            received += chunk
        assert received.startswith(b"HTTP/1.") and received.endswith(BODY)
        tls.close()
        [row] = _wait_decisions(world["a"], 1)
        assert (row.allowed, row.kind, row.host) == (True, "CONNECT", "localhost")
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=20)
    assert process.returncode == 0, err[-2000:]
    assert os.path.exists(path) is False or path.is_socket()
