"""Protocol peers for the production profile's tests: a Kubernetes API emulator (kmock) and moto's S3/STS server.

Both run on 127.0.0.1 in background threads and are reached over HTTP by the real clients
(``kubernetes`` through a kubeconfig file, boto3 through an endpoint URL), never by patching.

kmock 0.8 serves namespaced objects well, but it cannot route the cluster-scoped
``/api/v1/namespaces`` resource (its URL parser reads ``namespaces/<name>`` as a namespace
scope) and it does not cascade a namespace's deletion. ``ClusterEmulator`` adds exactly
that, the way a real API server behaves: Namespace create/get/patch/list/delete, with
deletion first marking the namespace ``Terminating`` and, a moment later, removing it and
every object in it. Everything else is kmock's own emulator.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp.web
import kmock
import yaml
from kmock import resource

NAMESPACES = resource("v1/namespaces")


class ClusterEmulator(kmock.KubernetesEmulator):
    """kmock's emulator plus the Namespace resource (see the module docstring)."""

    namespace_finalize_delay_s: float = 0.3

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # (method, path) of every request the control plane's client made (not the test's or the fake
        # kubelet's urllib calls): what its RBAC must allow.
        self.client_requests: list[tuple[str, str]] = []

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        if not raw_request.headers.get("User-Agent", "").startswith("Python-urllib"):
            self.client_requests.append((raw_request.method, raw_request.path))
        parts = raw_request.path.strip("/").split("/")
        if parts[:3] == ["api", "v1", "namespaces"] and len(parts) <= 4:
            await raw_request.read()
            return await self._namespaces(raw_request, parts[3] if len(parts) == 4 else None)
        return await super().__call__(raw_request)

    def _live(self, name: str) -> Any:
        key = (NAMESPACES, None, name)
        if key in self.objects and not self.objects[key].deleted:
            return self.objects[key]
        return None

    async def _namespaces(self, request: aiohttp.web.BaseRequest, name: str | None) -> aiohttp.web.StreamResponse:
        method = request.method
        if name is None and method == "GET":
            items = [o.raw for (r, _, _), o in self.objects.items() if r == NAMESPACES and not o.deleted]
            return aiohttp.web.json_response({"apiVersion": "v1", "kind": "NamespaceList", "items": items})
        if name is None and method == "POST":
            body = json.loads(await request.text())
            name = body["metadata"]["name"]
            if self._live(name) is not None:
                return _status(409, "AlreadyExists", f'namespaces "{name}" already exists')
            body.setdefault("status", {"phase": "Active"})
            body["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = name
            self.objects[NAMESPACES, None, name] = body
            return aiohttp.web.json_response(self._live(name).raw, status=201)
        if name is None:
            return _status(405, "MethodNotAllowed", method)
        obj = self._live(name)
        if obj is None:
            return _status(404, "NotFound", f'namespaces "{name}" not found')
        if method == "GET":
            return aiohttp.web.json_response(obj.raw)
        if method == "PATCH":
            obj.patch(json.loads(await request.text()))
            return aiohttp.web.json_response(obj.raw)
        if method == "DELETE":
            if not obj.get("metadata", {}).get("deletionTimestamp"):
                now = datetime.datetime.now(tz=datetime.UTC).isoformat()
                obj.patch({"metadata": {"deletionTimestamp": now}, "status": {"phase": "Terminating"}})
                asyncio.get_running_loop().call_later(self.namespace_finalize_delay_s, self._finalize, name)
            return aiohttp.web.json_response(obj.raw)
        return _status(405, "MethodNotAllowed", method)

    def _finalize(self, name: str) -> None:
        for (_res, ns, _name), obj in list(self.objects.items()):
            if ns == name and not obj.deleted:
                obj.delete()
        obj = self._live(name)
        if obj is not None:
            obj.delete()


def _status(code: int, reason: str, message: str) -> aiohttp.web.Response:
    body = {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code, "reason": reason,
            "message": message}
    return aiohttp.web.json_response(body, status=code)


class EmulatorThread:
    """``ClusterEmulator`` served over HTTP from its own event loop thread."""

    def __init__(self) -> None:
        self.emulator: ClusterEmulator | None = None
        self.url = ""
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True, name="kmock")

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with ClusterEmulator() as emulator, kmock.Server(emulator) as server:
            self.emulator = emulator
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def start(self) -> EmulatorThread:
        self._thread.start()
        if not self._ready.wait(15):
            raise RuntimeError("kmock emulator did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def write_kubeconfig(self, path: Path) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "controlplane", "user": {"token": "emulator-token"}}],
            "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "controlplane"}}],
            "current-context": "emulator",
        }
        path.write_text(yaml.safe_dump(config))
        return path

    # --- raw HTTP helpers, for what a test does "behind the driver's back" ----------------------

    def http(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,  # noqa: S310 - loopback only
                                     headers={"Content-Type": content_type, "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def objects(self, namespace: str) -> dict[tuple[str, str], dict[str, Any]]:
        """Live objects of one namespace (plus the namespace itself), by (plural, name)."""
        assert self.emulator is not None
        found = {}
        for (res, ns, name), obj in list(self.emulator.objects.items()):
            if obj.deleted:
                continue
            if ns == namespace or (res == NAMESPACES and name == namespace):
                found[(res.plural, name)] = json.loads(json.dumps(obj.raw))
        return found

    def request_count(self, method: str) -> int:
        assert self.emulator is not None
        return sum(1 for r in self.emulator._requests if r.method == method)  # noqa: SLF001


class FakeKubelet:
    """Plays kubelet + StatefulSet controller over HTTP: marks every StatefulSet's pod ready.

    The emulator runs no pods, so "ready" is the status a controller would report; the test
    decides whether (and when) it appears.
    """

    def __init__(self, cluster: EmulatorThread, *, interval_s: float = 0.05) -> None:
        self.cluster = cluster
        self.interval_s = interval_s
        self.enabled = threading.Event()
        self.enabled.set()
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="fake-kubelet")

    def _run(self) -> None:
        while not self._halt.wait(self.interval_s):
            if not self.enabled.is_set():
                continue
            listing = self.cluster.http("GET", "/apis/apps/v1/statefulsets") or {"items": []}
            for sts in listing.get("items", []):
                status = sts.get("status") or {}
                if status.get("readyReplicas") == sts["spec"].get("replicas", 1):
                    continue
                meta = sts["metadata"]
                replicas = sts["spec"].get("replicas", 1)
                self.cluster.http(
                    "PATCH", f"/apis/apps/v1/namespaces/{meta['namespace']}/statefulsets/{meta['name']}/status",
                    {"status": {"replicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas,
                                "currentReplicas": replicas, "updatedReplicas": replicas}},
                    content_type="application/merge-patch+json",
                )

    def start(self) -> FakeKubelet:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._halt.set()
        self._thread.join(5)


@contextmanager
def moto_server() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def wait_until(predicate: Any, *, timeout: float = 10.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what or predicate}")


def run_cluster(tmp_path: Path, settings: Any) -> Iterator[EmulatorThread]:
    """Body of a ``cluster`` fixture: the emulator + a fake kubelet, settings pointing at it via a kubeconfig."""
    emulator = EmulatorThread().start()
    kubelet = FakeKubelet(emulator).start()
    settings.KUBERNETES_KUBECONFIG = str(emulator.write_kubeconfig(tmp_path / "kubeconfig"))
    settings.KUBERNETES_IN_CLUSTER = False
    settings.KUBERNETES_CONTEXT = None
    settings.KUBERNETES_READY_POLL_S = 0.05
    settings.KUBERNETES_READY_TIMEOUT_S = 5.0
    settings.KUBERNETES_NAMESPACE_DELETE_TIMEOUT_S = 5.0
    settings.KUBERNETES_POSTGRES_CIDRS = ["10.20.0.0/24"]
    settings.KUBERNETES_OBJECTSTORE_CIDRS = ["10.30.0.0/24"]
    settings.CONTROL_PLANE_INTERNAL_URL = "http://web.agent-control-plane.svc:8000"
    emulator.kubelet = kubelet
    yield emulator
    kubelet.stop()
    emulator.stop()
