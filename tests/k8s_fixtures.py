"""Protocol peers for the production profile's tests: a Kubernetes API emulator (kmock) and moto's S3/STS server.

Both run on 127.0.0.1 in background threads and are reached over HTTP by the real clients
(``kubernetes`` through a kubeconfig file, boto3 through an endpoint URL), never by patching.

kmock 0.8 serves namespaced objects well, but it cannot route the cluster-scoped
``/api/v1/namespaces`` resource (its URL parser reads ``namespaces/<name>`` as a namespace
scope) and it does not cascade a namespace's deletion. ``ClusterEmulator`` adds exactly
that, the way a real API server behaves: Namespace create/get/patch/list/delete, with
deletion first marking the namespace ``Terminating`` and, a moment later, removing it and
every object in it. Everything else is kmock's own emulator.

kmock's own watch streams carry no ``resourceVersion`` (its lists answer ``"..."``), ignore
``labelSelector``, ``timeoutSeconds`` and a ``resourceVersion`` to resume from, and never answer
410 Gone, so the real client's ``Watch`` could not resume on them. Pods are therefore served
by ``ClusterEmulator`` too, as the API server does: every change bumps one resourceVersion
counter and is kept in a history; ``?watch=true`` streams newline-delimited JSON events (the
current objects as ADDED when no resourceVersion is given, else every change after it), honours
``labelSelector`` and ``timeoutSeconds``, and answers an ERROR event with a 410 Status for a
resourceVersion older than the history (``compact_pod_history``). ``drop_pod_watches`` cuts every
open stream, as an API server restart or a load balancer would; ``hold_pod_watches`` keeps new
watch requests waiting at the server until released, so a test changes pods while a client is
away without racing its reconnection. With ``pods=True`` the fake kubelet also plays the
StatefulSet controller: it creates each StatefulSet's pod, replaces it when deleted or when the
template changes, and reports it running and ready after ``boot_s``.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp.web
import kmock
import yaml
from kmock import resource

NAMESPACES = resource("v1/namespaces")
STATEFULSETS = resource("apps/v1/statefulsets")
_DROP = object()  # queued to a pod watch stream: cut the connection


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """RFC 7386 JSON merge patch, in place (null deletes a key)."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = json.loads(json.dumps(value))


def _selects(selector: str, labels: dict[str, str]) -> bool:
    """Equality-based label selectors (``a=b``, ``a==b``, ``a!=b``, ``a``, ``!a``), comma-separated."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


class ClusterEmulator(kmock.KubernetesEmulator):
    """kmock's emulator plus the Namespace resource (see the module docstring)."""

    namespace_finalize_delay_s: float = 0.3

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # (method, path) of every request the control plane's client made (not the test's or the fake
        # kubelet's urllib calls): what its RBAC must allow.
        self.client_requests: list[tuple[str, str]] = []
        self.client_queries: list[tuple[str, str, str]] = []  # the same, with the query string (list vs watch)
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.pod_rv = 0
        self.pod_history: list[tuple[int, str, dict[str, Any]]] = []
        self.pod_history_floor = 0  # a watch from a resourceVersion below this answers 410 Gone
        self.pod_watches: set[asyncio.Queue[Any]] = set()
        # While set and not released, a new watch request waits before the server reads its resourceVersion:
        # a test changes the cluster while the client is away without racing the client's reconnection.
        self.pod_watch_gate: asyncio.Event | None = None
        self.pod_watches_waiting = 0
        self.pod_deletion_delay_s = 0.0  # > 0: a DELETE marks the pod terminating first, as a kubelet's grace does
        # Set by FakeKubelet(pods=True): deleting a StatefulSet's pod drops its readyReplicas in the same request,
        # so a caller waiting for readiness right after never reads the status from before the deletion.
        self.statefulset_pods = False

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        if not raw_request.headers.get("User-Agent", "").startswith("Python-urllib"):
            self.client_requests.append((raw_request.method, raw_request.path))
            self.client_queries.append((raw_request.method, raw_request.path, raw_request.query_string))
        parts = raw_request.path.strip("/").split("/")
        if parts == ["api", "v1", "pods"]:
            await raw_request.read()
            return await self._pods(raw_request, None, None, status=False)
        if parts[:3] == ["api", "v1", "namespaces"] and len(parts) >= 5 and parts[4] == "pods" and len(parts) <= 7:
            await raw_request.read()
            return await self._pods(raw_request, parts[3], parts[5] if len(parts) > 5 else None,
                                    status=len(parts) == 7 and parts[6] == "status")
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
        for key in [k for k in self.pods if k[0] == name]:
            self._pod_remove(key)
        for (_res, ns, _name), obj in list(self.objects.items()):
            if ns == name and not obj.deleted:
                obj.delete()
        obj = self._live(name)
        if obj is not None:
            obj.delete()

    # --- pods, with resourceVersions, a history and real watch streams (see the module docstring) -------

    def _pod_event(self, kind: str, obj: dict[str, Any]) -> None:
        self.pod_rv += 1
        obj["metadata"]["resourceVersion"] = str(self.pod_rv)
        snapshot = json.loads(json.dumps(obj))
        self.pod_history.append((self.pod_rv, kind, snapshot))
        for queue in list(self.pod_watches):
            queue.put_nowait((kind, snapshot))

    def compact_pod_history(self) -> None:
        """Forget every change so far: a watch resuming from an older resourceVersion gets 410 Gone."""
        self.pod_history.clear()
        self.pod_history_floor = self.pod_rv

    def drop_pod_watches(self) -> None:
        for queue in list(self.pod_watches):
            queue.put_nowait(_DROP)

    def hold_pod_watches(self) -> None:
        self.pod_watch_gate = asyncio.Event()

    def release_pod_watches(self) -> None:
        if self.pod_watch_gate is not None:
            self.pod_watch_gate.set()
            self.pod_watch_gate = None

    def _pod_remove(self, key: tuple[str, str]) -> None:
        obj = self.pods.pop(key, None)
        if obj is not None:
            self._pod_event("DELETED", obj)

    def _pod_unready(self, namespace: str, pod_name: str) -> None:
        key = (STATEFULSETS, namespace, pod_name.rpartition("-")[0])
        sts = self.objects[key] if key in self.objects else None
        if self.statefulset_pods and sts is not None and not sts.deleted:
            sts.patch({"status": {"readyReplicas": 0, "availableReplicas": 0}})

    async def _pods(self, request: aiohttp.web.BaseRequest, namespace: str | None, name: str | None, *,
                    status: bool) -> aiohttp.web.StreamResponse:
        method, query = request.method, request.query
        if name is None and method == "GET":
            selector = query.get("labelSelector", "")
            def matches(obj: dict[str, Any]) -> bool:
                meta = obj["metadata"]
                return (namespace is None or meta["namespace"] == namespace) and \
                    _selects(selector, meta.get("labels") or {})
            if query.get("watch") in ("true", "1"):
                return await self._pod_watch(request, matches)
            items = [o for o in self.pods.values() if matches(o)]
            return aiohttp.web.json_response({"apiVersion": "v1", "kind": "PodList", "items": items,
                                              "metadata": {"resourceVersion": str(self.pod_rv)}})
        if name is None and method == "POST" and namespace is not None:
            body = json.loads(await request.text())
            meta = body.setdefault("metadata", {})
            meta["namespace"] = namespace
            key = (namespace, meta["name"])
            home = self._live(namespace)
            if home is None or home.get("metadata", {}).get("deletionTimestamp"):
                return _status(403, "Forbidden", f"namespace {namespace} is missing or terminating")
            if key in self.pods:
                return _status(409, "AlreadyExists", f'pods "{meta["name"]}" already exists')
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now())
            body.setdefault("status", {"phase": "Pending"})
            self.pods[key] = body
            self._pod_event("ADDED", body)
            return aiohttp.web.json_response(body, status=201)
        if name is None or namespace is None:
            return _status(405, "MethodNotAllowed", method)
        key = (namespace, name)
        obj = self.pods.get(key)
        if obj is None:
            return _status(404, "NotFound", f'pods "{name}" not found')
        if method == "GET":
            return aiohttp.web.json_response(obj)
        if method in ("PATCH", "PUT"):
            patch = json.loads(await request.text())
            if status:
                patch = {"status": patch.get("status") or {}}
            if method == "PUT":
                obj.clear()
            _merge(obj, patch)
            self._pod_event("MODIFIED", obj)
            return aiohttp.web.json_response(obj)
        if method == "DELETE":
            self._pod_unready(namespace, name)
            if self.pod_deletion_delay_s > 0:
                if not obj["metadata"].get("deletionTimestamp"):
                    obj["metadata"]["deletionTimestamp"] = _now()
                    self._pod_event("MODIFIED", obj)
                    asyncio.get_running_loop().call_later(self.pod_deletion_delay_s, self._pod_remove, key)
                return aiohttp.web.json_response(obj)
            self._pod_remove(key)
            return aiohttp.web.json_response(obj)
        return _status(405, "MethodNotAllowed", method)

    async def _pod_watch(self, request: aiohttp.web.BaseRequest, matches: Any) -> aiohttp.web.StreamResponse:
        gate = self.pod_watch_gate
        if gate is not None:
            self.pod_watches_waiting += 1
            try:
                await gate.wait()
            finally:
                self.pod_watches_waiting -= 1
        since = request.query.get("resourceVersion", "")
        timeout_s = float(request.query.get("timeoutSeconds") or 1800)
        response = aiohttp.web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        await response.prepare(request)
        queue: asyncio.Queue[Any] = asyncio.Queue()

        async def send(kind: str, obj: dict[str, Any]) -> None:
            await response.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

        if since not in ("", "0") and int(since) < self.pod_history_floor:
            await send("ERROR", {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
                                 "reason": "Expired", "code": 410,
                                 "message": f"too old resource version: {since} ({self.pod_history_floor})"})
            await response.write_eof()
            return response
        # Snapshot and subscribe without yielding to the loop in between: no change is lost or doubled.
        if since in ("", "0"):
            backlog = [("ADDED", json.loads(json.dumps(o))) for o in self.pods.values()]
        else:
            backlog = [(kind, obj) for rv, kind, obj in self.pod_history if rv > int(since)]
        self.pod_watches.add(queue)
        try:
            for kind, obj in backlog:
                if matches(obj):
                    await send(kind, obj)
            deadline = asyncio.get_running_loop().time() + timeout_s
            while True:
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    break
                try:
                    item = await asyncio.wait_for(queue.get(), remaining)
                except TimeoutError:
                    break
                if item is _DROP:
                    if request.transport is not None:
                        request.transport.close()  # cut, not ended: the client sees a broken stream
                    return response
                if matches(item[1]):
                    await send(*item)
        finally:
            self.pod_watches.discard(queue)
        await response.write_eof()
        return response


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

    def in_loop(self, fn: Any, *args: Any) -> Any:
        """Run ``fn`` on the emulator's event loop (its state is not thread-safe) and return its result."""
        assert self._loop is not None

        async def call() -> Any:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result(10)

    def compact_pod_history(self) -> None:
        assert self.emulator is not None
        self.in_loop(self.emulator.compact_pod_history)

    def drop_pod_watches(self) -> None:
        assert self.emulator is not None
        self.in_loop(self.emulator.drop_pod_watches)

    def pod_watch_count(self) -> int:
        assert self.emulator is not None
        return int(self.in_loop(lambda: len(self.emulator.pod_watches)))  # type: ignore[union-attr]

    def hold_pod_watches(self) -> None:
        """New watch requests wait at the server until ``release_pod_watches`` (held ones go on)."""
        assert self.emulator is not None
        self.in_loop(self.emulator.hold_pod_watches)

    def release_pod_watches(self) -> None:
        assert self.emulator is not None
        self.in_loop(self.emulator.release_pod_watches)

    def pod_watches_waiting(self) -> int:
        assert self.emulator is not None
        return int(self.in_loop(lambda: self.emulator.pod_watches_waiting))  # type: ignore[union-attr]

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
    decides whether (and when) it appears. With ``pods=True`` it also keeps one pod per StatefulSet
    (``<name>-0``, the template's labels and spec): created when missing, replaced when the template
    changed (a rolling update), reported ``Running`` and ready ``boot_s`` after it was created (once:
    afterwards the pod's status is the test's to change), and the StatefulSet is ready only while
    that pod is. At ``replicas: 0`` the pod is deleted and none is made (scale to zero).
    """

    def __init__(self, cluster: EmulatorThread, *, interval_s: float = 0.05, pods: bool = False,
                 boot_s: float = 0.0) -> None:
        self.cluster = cluster
        self.interval_s = interval_s
        self.pods = pods
        self.boot_s = boot_s
        self.enabled = threading.Event()
        self.enabled.set()
        self._halt = threading.Event()
        self._booting: dict[str, float] = {}  # pod uid -> when it was created
        self._thread = threading.Thread(target=self._run, daemon=True, name="fake-kubelet")

    def _run(self) -> None:
        while not self._halt.wait(self.interval_s):
            if not self.enabled.is_set():
                continue
            listing = self.cluster.http("GET", "/apis/apps/v1/statefulsets") or {"items": []}
            for sts in listing.get("items", []):
                if self.pods:
                    self._control(sts)
                    continue
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

    def _control(self, sts: dict[str, Any]) -> None:
        meta, template = sts["metadata"], sts["spec"]["template"]
        ns, pod_name = meta["namespace"], f"{meta['name']}-0"
        revision = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]
        pods = f"/api/v1/namespaces/{ns}/pods"
        replicas = int(sts["spec"].get("replicas", 1))
        try:
            pod = self.cluster.http("GET", f"{pods}/{pod_name}")
            if replicas == 0:  # scaled to zero: the pod goes and no new one is made
                if pod is not None and not pod["metadata"].get("deletionTimestamp"):
                    self.cluster.http("DELETE", f"{pods}/{pod_name}")
                ready = False
            else:
                ready = self._keep_pod(ns, pod_name, pod, template, revision)
        except urllib.error.HTTPError:
            return  # the namespace went away between our calls: next round
        n = 1 if ready else 0
        status = {"replicas": replicas, "readyReplicas": n, "availableReplicas": n, "currentReplicas": replicas,
                  "updatedReplicas": replicas, "currentRevision": revision, "updateRevision": revision}
        if {k: (sts.get("status") or {}).get(k) for k in status} != status:
            self.cluster.http("PATCH", f"/apis/apps/v1/namespaces/{ns}/statefulsets/{meta['name']}/status",
                              {"status": status}, content_type="application/merge-patch+json")

    def _keep_pod(self, ns: str, pod_name: str, pod: dict[str, Any] | None, template: dict[str, Any],
                  revision: str) -> bool:
        """One StatefulSet pod kept as its controller would: made when missing, replaced when its template
        changed, reported ready ``boot_s`` after it was made. True while it is ready."""
        pods = f"/api/v1/namespaces/{ns}/pods"
        if pod is None:
            labels = {**(template.get("metadata") or {}).get("labels", {}), "controller-revision-hash": revision}
            pod = self.cluster.http("POST", pods, {
                "apiVersion": "v1", "kind": "Pod", "spec": template["spec"],
                "metadata": {"name": pod_name, "namespace": ns, "labels": labels},
                "status": {"phase": "Pending"}})
            self._booting[pod["metadata"]["uid"]] = time.monotonic()
        pod_meta = pod["metadata"]
        if pod_meta.get("deletionTimestamp"):
            ready = False
        elif pod_meta["labels"].get("controller-revision-hash") != revision:
            self.cluster.http("DELETE", f"{pods}/{pod_name}")  # rolling update: the old revision goes
            ready = False
        else:
            born = self._booting.get(pod_meta["uid"])
            if born is not None and time.monotonic() - born >= self.boot_s:
                del self._booting[pod_meta["uid"]]
                pod = self.cluster.http("PATCH", f"{pods}/{pod_name}/status", {"status": {
                    "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                    "containerStatuses": [{"name": c["name"], "ready": True, "restartCount": 0, "image": "x",
                                           "imageID": "", "state": {"running": {"startedAt": _now()}}}
                                          for c in template["spec"]["containers"]]}},
                    content_type="application/merge-patch+json")
            conditions = (pod.get("status") or {}).get("conditions") or []
            ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        return ready

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


def run_cluster(tmp_path: Path, settings: Any, *, pods: bool = False, boot_s: float = 0.0) -> Iterator[EmulatorThread]:
    """Body of a ``cluster`` fixture: the emulator + a fake kubelet, settings pointing at it via a kubeconfig.

    ``pods``/``boot_s``: the fake kubelet also keeps each StatefulSet's pod (see ``FakeKubelet``)."""
    emulator = EmulatorThread().start()
    kubelet = FakeKubelet(emulator, pods=pods, boot_s=boot_s).start()
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
    assert emulator.emulator is not None
    emulator.emulator.statefulset_pods = pods
    yield emulator
    kubelet.stop()
    emulator.stop()
