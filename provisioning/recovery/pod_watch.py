"""Recovery in seconds on Kubernetes: watch the agent pods' events and start the dead recovery of an instance
whose pod died, instead of waiting for its heartbeats to go silent (``HEARTBEAT_TIMEOUT_S``, then a sweep).

On the local profile the control plane is the instance's parent (``exit_notice``); on Kubernetes the kubelet
is, and the API server tells whoever watches. ``PodWatcher`` lists the agent pods of every tenant namespace
(one cluster-wide list and watch, label selector ``AGENT_POD_SELECTOR``), then watches from the list's
resourceVersion, resuming from the last one it saw after each server timeout or broken stream (with
exponential backoff on errors) and listing again on 410 Gone (its resourceVersion was compacted away; pods
that vanished meanwhile are taken as deleted). What an event means (``pod_verdict``):

- the pod was deleted, is being deleted (``deletionTimestamp``) or ended (phase ``Failed``, e.g. evicted), or
  its agent container is in ``CrashLoopBackOff``: the instance is dead now;
- its agent container terminated in place: the kubelet restarts it itself (``restartPolicy: Always``, the
  first restart at once). The watcher gives it ``restart_grace_s`` (default: the heartbeat timeout); if by
  then the same pod's container runs again with a higher ``restartCount``, nothing is started (logged as
  "restarted by the kubelet": the runtime read back its state on that boot, as after any restart) - a
  recovery would only stop the fresh container again. Otherwise the instance is dead;
- a higher ``restartCount`` with the container running, seen without the termination before it: logged only.

"Dead" goes through ``exit_notice.instance_dead_notice``, the decision the local notice uses: nothing is
started for an instance not marked running (planned stops, restarts, rolling restarts, release switches and
suspends mark it ``stopped`` before they delete its pod; deprovisioning moves the tenant out of ready) or one
back already: here, another pod of it is running and ready, or the same pod's container was restarted (the
event may be old: the watcher can lag behind a planned restart that already finished). ``recovery_start``
refuses a second active recovery per instance (row lock), so two watchers, or a watcher and the sweep, never
start two. What it does not see, by design: hangs (the pod runs, the agent does not) and lost nodes (the
pod's status stops changing): the heartbeat timeout remains for those.
"""

from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.db import connections
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch
from kubernetes.client import CoreV1Api  # imported now, not on first use: see PodWatcher.__init__
from kubernetes.client.exceptions import ApiException

from provisioning.drivers.k8s_client import api_client_from_settings
from provisioning.drivers.k8s_manifests import LABEL_MANAGED_BY, LABEL_TENANT, MANAGER, NAMES
from provisioning.recovery.exit_notice import instance_dead_notice

__all__ = ["AGENT_POD_SELECTOR", "PodState", "PodWatcher", "pod_state", "pod_verdict"]

log = logging.getLogger(__name__)

AGENT_POD_SELECTOR = f"{LABEL_MANAGED_BY}={MANAGER},app.kubernetes.io/name={NAMES.workload}"

# What an event says about the instance (pod_verdict).
DEAD, WAIT, RESTARTED, NOTHING = "dead", "wait", "restarted", "nothing"


@dataclass(frozen=True)
class PodState:
    """What the watcher needs of one agent pod (the API object has much more)."""

    namespace: str
    name: str
    uid: str
    tenant_id: str
    phase: str
    terminating: bool
    ready: bool
    container: str  # the agent container's state: running | terminated | waiting | "" (no status yet)
    reason: str  # its terminated or waiting reason (OOMKilled, Error, CrashLoopBackOff, ...)
    exit_code: int | None
    restart_count: int

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name


def pod_state(raw: Mapping[str, Any]) -> PodState | None:
    """The agent pod's state from its API object; None for a pod without a tenant label (not ours)."""
    meta = raw.get("metadata") or {}
    tenant_id = (meta.get("labels") or {}).get(LABEL_TENANT)
    if not tenant_id:
        return None
    status = raw.get("status") or {}
    containers = status.get("containerStatuses") or []
    agent: Mapping[str, Any] = next((c for c in containers if c.get("name") == NAMES.container), {})
    state = agent.get("state") or {}
    kind = next((k for k in ("running", "terminated", "waiting") if state.get(k) is not None), "")
    detail = state.get(kind) or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    return PodState(
        namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")), uid=str(meta.get("uid", "")),
        tenant_id=str(tenant_id), phase=str(status.get("phase", "")), terminating=bool(meta.get("deletionTimestamp")),
        ready=ready, container=kind, reason=str(detail.get("reason", "")),
        exit_code=detail.get("exitCode") if kind == "terminated" else None,
        restart_count=int(agent.get("restartCount") or 0),
    )


def pod_verdict(kind: str, state: PodState, previous: PodState | None) -> tuple[str, str]:
    """(DEAD | WAIT | RESTARTED | NOTHING, why) for a watch event ``kind`` on ``state``, ``previous`` being the
    same pod as last seen (None: first sight). No I/O: whether the instance is meant to run is decided later."""
    same = previous is not None and previous.uid == state.uid
    if kind == "DELETED":
        return DEAD, "its pod was deleted"
    if state.terminating:
        return (NOTHING, "") if same and previous.terminating else (DEAD, "its pod is being deleted")  # type: ignore[union-attr]
    if state.phase in ("Failed", "Succeeded"):
        return DEAD, f"its pod {state.phase.lower()}" + (f" ({state.reason})" if state.reason else "")
    if state.container == "waiting" and state.reason == "CrashLoopBackOff":
        return DEAD, f"its agent container is crash-looping ({state.restart_count} restarts)"
    if state.container == "terminated":
        return WAIT, f"its agent container terminated (exit code {state.exit_code}, {state.reason or 'no reason'})"
    if same and state.container == "running" and state.restart_count > previous.restart_count:  # type: ignore[union-attr]
        return RESTARTED, f"restarted by the kubelet (restart {state.restart_count})"
    return NOTHING, ""


class PodWatcher:
    """One cluster-wide list-and-watch of the agent pods; ``run`` until ``stop``. Thread-safe ``stop``."""

    def __init__(self, *, api_client: k8s.ApiClient | None = None, label_selector: str = AGENT_POD_SELECTOR,
                 timeout_s: int = 300, restart_grace_s: float = 10.0, backoff_s: float = 0.5,
                 backoff_max_s: float = 30.0, progress: Callable[[str], None] | None = None,
                 leading: Callable[[], bool] = lambda: True) -> None:
        # ``kubernetes.client`` loads CoreV1Api's module (hundreds of models, seconds on a busy machine) on first
        # use; it is imported with this module instead, at the command's start, because a watcher is made in the
        # leader's thread right after it took the lease, where that import outlasted a short lease before its first
        # renewal (tests/provisioning/test_pod_watch_leader.py).
        self.core = CoreV1Api(api_client or api_client_from_settings())
        self.label_selector = label_selector
        self.timeout_s = timeout_s  # the server ends each watch after this; we resume from the last version
        self.restart_grace_s = restart_grace_s
        self.backoff_s, self.backoff_max_s = backoff_s, backoff_max_s
        self.progress = progress or (lambda message: log.info(message))
        # Whether this watcher may act now (its leader lease held, watch_instances): asked before each notice,
        # so a watcher frozen past its lease and resumed starts nothing before its lease thread stops it.
        self.leading = leading
        self.resource_version: str | None = None
        self.relists = 0
        self.outcomes: list[tuple[str, str, str]] = []  # (tenant id, why, what the notice did), for tests and logs
        self._pods: dict[tuple[str, str], PodState] = {}
        self._pending: dict[tuple[str, int], threading.Timer] = {}
        # Pods whose death was judged already: a pod's end shows in several events (deletionTimestamp, then
        # DELETED up to its grace period later) and the first one decides. A planned stop deletes the pod while
        # the instance is marked stopped, and the instance may be running again when the DELETED arrives.
        self._judged: set[str] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._watch: k8s_watch.Watch | None = None
        self._failures = 0

    # --- the loop ---------------------------------------------------------------------------------------

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                if self.resource_version is None:
                    self._list()
                if self._stopping.is_set():  # stopped during the list (a lost lease): no watch to open
                    break
                self._watch_once()
            except ApiException as exc:
                if exc.status == 410:
                    self.progress(f"resourceVersion {self.resource_version} expired (410 Gone): listing again")
                    self.resource_version = None
                    continue
                self._backoff(f"the API answered {exc.status}: {exc.reason}")
            except Exception as exc:  # noqa: BLE001 - a broken stream, a refused connection: retried, never fatal
                if not self._stopping.is_set():
                    self._backoff(f"{type(exc).__name__}: {exc}")
        for timer in list(self._pending.values()):
            timer.cancel()

    def stop(self) -> None:
        self._stopping.set()
        if self._watch is not None:
            self._watch.stop()  # shuts the stream's socket down: a blocked read returns now

    def _backoff(self, why: str) -> None:
        delay = min(self.backoff_max_s, self.backoff_s * 2 ** self._failures) * random.uniform(0.8, 1.2)  # noqa: S311
        self._failures += 1
        self.progress(f"watch interrupted ({why}); resuming from {self.resource_version} in {delay:.1f} s")
        self._stopping.wait(delay)

    def _list(self) -> None:
        response = self.core.list_pod_for_all_namespaces(label_selector=self.label_selector,
                                                         _preload_content=False, _request_timeout=30)
        # kubernetes types the call's return as the parsed model; with _preload_content=False it is the raw
        # urllib3 response (as its docstring says), whose body we parse ourselves.
        listing = json.loads(response.data)  # type: ignore[attr-defined]
        listed = [state for state in (pod_state(raw) for raw in listing.get("items") or []) if state is not None]
        uids = {state.key: state.uid for state in listed}
        for last in list(self._pods.values()):
            if uids.get(last.key) != last.uid:  # gone (or replaced) while we were not watching: its DELETED was lost
                self._handle("DELETED", {"metadata": {"namespace": last.namespace, "name": last.name,
                                                      "uid": last.uid, "labels": {LABEL_TENANT: last.tenant_id}}})
        for raw in listing.get("items") or []:
            self._handle("MODIFIED", raw)
        self.resource_version = str((listing.get("metadata") or {}).get("resourceVersion") or "") or None
        self.relists += 1
        self._failures = 0
        self.progress(f"listed {len(listed)} agent pods at resourceVersion {self.resource_version}")

    def _watch_once(self) -> None:
        # return_type=object: events as plain dicts (no model validation), the client's ERROR/410 handling kept.
        self._watch = k8s_watch.Watch(return_type=object)
        if self._stopping.is_set():  # ``stop`` ran before the watch existed: it could not shut it; do not open it
            return
        self.progress(f"watching agent pods from resourceVersion {self.resource_version}")
        for event in self._watch.stream(self.core.list_pod_for_all_namespaces, label_selector=self.label_selector,
                                        resource_version=self.resource_version, timeout_seconds=self.timeout_s,
                                        allow_watch_bookmarks=True, _request_timeout=self.timeout_s + 30):
            raw = event["raw_object"]
            version = (raw.get("metadata") or {}).get("resourceVersion")
            if version:
                self.resource_version = str(version)
            self._failures = 0
            if event["type"] != "BOOKMARK":
                self._handle(event["type"], raw)
            if self._stopping.is_set():
                break

    # --- one event ------------------------------------------------------------------------------------------

    def _handle(self, kind: str, raw: Mapping[str, Any]) -> None:
        state = pod_state(raw)
        if state is None:
            return
        with self._lock:
            previous = self._pods.get(state.key)
            if kind == "DELETED":
                if previous is not None and previous.uid == state.uid:
                    del self._pods[state.key]
            else:
                self._pods[state.key] = state
        verdict, why = pod_verdict(kind, state, previous)
        if verdict == DEAD:
            with self._lock:
                first = state.uid not in self._judged
                if kind == "DELETED":
                    self._judged.discard(state.uid)  # its last event
                else:
                    self._judged.add(state.uid)
            if first:
                self._notice(state, why)
        elif verdict == WAIT:
            self._wait_for_kubelet(state, why)
        elif verdict == RESTARTED:
            with self._lock:  # a termination waiting for the kubelet is settled: the kubelet did restart it
                for pending in [k for k in self._pending if k[0] == state.uid]:
                    self._pending.pop(pending).cancel()
            self.progress(f"tenant {state.tenant_id}: {why} in pod {state.namespace}/{state.name}; no recovery")
            self.outcomes.append((state.tenant_id, why, "left to the kubelet"))

    def _wait_for_kubelet(self, state: PodState, why: str) -> None:
        key = (state.uid, state.restart_count)
        with self._lock:
            if key in self._pending or self._stopping.is_set():
                return

            def check() -> None:
                try:
                    self._notice(state, f"{why}, and the kubelet did not restart it within "
                                        f"{self.restart_grace_s:g} s")
                finally:
                    connections.close_all()  # this timer thread's own connections
                    self._pending.pop(key, None)

            timer = threading.Timer(self.restart_grace_s, check)
            timer.daemon = True
            self._pending[key] = timer
        self.progress(f"tenant {state.tenant_id}: {why}; giving the kubelet {self.restart_grace_s:g} s")
        timer.start()

    def _back_already(self, dead: PodState) -> bool:
        """Is the instance up again, asked of the API now (the event may be old)? Another pod of it running and
        ready, or the same pod's agent container restarted by the kubelet."""
        try:
            response = self.core.read_namespaced_pod(dead.name, dead.namespace, _preload_content=False,
                                                     _request_timeout=30)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        now = pod_state(json.loads(response.data))  # type: ignore[attr-defined]  # raw response, as in _list
        if now is None or now.terminating or now.phase != "Running" or now.container != "running":
            return False
        if now.uid != dead.uid:
            return now.ready
        return now.restart_count > dead.restart_count

    def _notice(self, state: PodState, why: str) -> str:
        if not self.leading():
            self.progress(f"tenant {state.tenant_id}: {why}: not acting, the leader lease is no longer held")
            return "not leading"
        detail = f"{why}; noticed from pod events ({state.namespace}/{state.name})"
        try:
            result = instance_dead_notice(
                state.tenant_id, detail=detail, present=lambda _spec: self._back_already(state),
                log_fields={"event": "pod_watch_notice", "namespace": state.namespace, "pod": state.name})
        except Exception:  # the sweep remains: a notice that cannot act must not stop the watch
            log.exception("pod notice failed", extra={"event": "pod_watch_notice_failed",
                                                      "tenant_id": state.tenant_id})
            result = "failed (left to the heartbeat sweep)"
        if result == "another host runs":
            result = "back already (left to the kubelet)"
        self.outcomes.append((state.tenant_id, why, result))
        self.progress(f"tenant {state.tenant_id}: {why} ({state.namespace}/{state.name}): {result}")
        return result
