"""``make demo``: onboard three customers through the REST API on the embedded default and show them.

Starts (or reuses) the embedded PostgreSQL, the web server, a Celery worker and beat;
creates a demo operator (its portal on ``demo-ops.localhost``, a name browsers and curl resolve
to this machine with no DNS or hosts-file entry), a staff user and a portal admin; onboards three
customers over HTTP with idempotency keys (so re-running the demo creates nothing twice); shows
progress until every instance is ready; prints each tenant's resources. Then the drill: the demo task in every
instance, one instance SIGKILLed while a step runs (seen starting in its step events), checked from those events
to have been cut short and resumed, the time from the kill to the resumed step, and each tenant's emails and
charges counted at the peers ("Exactly once: yes/NO"); one customer's account connected at the example OAuth
server and used by its calendar agent ("Connected account used: yes/NO"); a customer's conversation in the thread
the portal shows, its support agent calling a tool on the example CRM's MCP server registered for that customer
("MCP tool used: yes/NO", counted at that server); where to look next. Exit 1 when something of this did not happen.
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
import services  # noqa: E402

from controlplane.secretfiles import read_or_create_secret  # noqa: E402  (services put the root on sys.path)

ROOT = services.ROOT
SECRETS = services.VAR / "secrets"
LOG = services.LOG
OPERATOR = "demo-ops"
# *.localhost is loopback by definition (RFC 6761) and not a control-plane host, so this name serves the portal.
PORTAL_HOST = f"{OPERATOR}.localhost"
PORTAL_USER = "demo-admin"
CUSTOMERS = [("acme-corp", "Acme Corp"), ("globex", "Globex Corporation"), ("initech", "Initech")]
RESOURCE_KINDS = ("database", "volume", "objectstore", "vault", "runtime")
# Every step of the demo task pauses step_sleep_s after its work. The drill kills one instance while its step
# "pay" runs: the charge is made as the step starts, so the kill falls between a payment the provider made and
# the step's checkpoint, and the step that runs again must not pay twice.
DEMO_TASK_PARAMS = {"search_s": 0.5, "step_sleep_s": 3.0}
DRILL_STEP = "pay"
TASK_ENDED = ("done", "failed", "blocked", "cancelled")
# The thread the portal's and the dashboard's chat open (conversations.screens.DEFAULT_THREAD), so the demo's
# conversation is the one they show.
CHAT_THREAD = "portal"
# The connected account: the demo operator's OAuth client at the example OAuth server (agent_examples.peers.oauth),
# and the example agent that uses it (agent_examples.connected, kind "calendar").
OAUTH_PROVIDER = "example-oauth"
# The MCP server the support agent calls (agent_examples.peers.crm), registered for the customer that talks: its
# registry name, the credential holding its bearer token, and the one tool the agent is allowed (idempotent).
MCP_SERVER, MCP_CREDENTIAL, MCP_TOOL = "crm", "crm-token", "upsert_contact"
console = Console()


def manage(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    # The services' environment: an instance started from here needs the same INSTANCE_EXTRA_ENV (the peers).
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, capture_output=True, text=True,
                          check=check, env=services.service_env())


def secret_file(name: str, produce) -> str:  # type: ignore[no-untyped-def]
    """A demo credential kept in var/secrets (0600) so re-runs can reuse it.

    Created at most once, like the other generated secrets: if two demos race, both use the
    value that reached the disk first.
    """
    return read_or_create_secret(SECRETS / name, produce)


def operator_token() -> str:
    def produce() -> str:
        done = manage("create_operator", OPERATOR, "--name", "Demo Operator", "--domain", PORTAL_HOST, check=False)
        if done.returncode != 0:
            done = manage("create_operator_token", OPERATOR)
        return done.stdout.strip().splitlines()[-1]

    return secret_file("demo-operator-token", produce)


def staff_password() -> str:
    def produce() -> str:
        out = manage("ensure_staff_user", "admin").stdout.strip()
        return out.splitlines()[-1] if out else "(created earlier: see var/secrets)"

    return secret_file("admin-password", produce)


def portal_password() -> str:
    """The portal admin's password, generated once and kept in var/secrets (0600) like the staff password.

    Also gives an operator made by an older demo (host name "localhost", which only serves the dashboard)
    its ``*.localhost`` portal host.
    """
    def produce() -> str:
        done = manage("ensure_portal_user", OPERATOR, PORTAL_USER, "--domain", PORTAL_HOST, check=False)
        if done.returncode != 0:
            raise SystemExit(f"creating the portal user failed: {done.stderr.strip()}")
        out = done.stdout.strip()
        return out.splitlines()[-1] if out else "(created earlier: see var/secrets)"

    return secret_file("demo-portal-password", produce)


def portal_url() -> str:
    return f"http://{PORTAL_HOST}:{services.PORT}/"


def closing_lines(*, staff_password: str, portal_password: str) -> list[str]:
    """Where to look next: every URL the demo serves, and how to sign in to each."""
    return [
        f"API docs (Swagger UI): {services.BASE_URL}/api/docs/   OpenAPI: {services.BASE_URL}/api/schema/",
        f"Staff dashboard: {services.BASE_URL}/dashboard/   Admin: {services.BASE_URL}/admin/   "
        f"user: admin   password: {staff_password}",
        f"Operator portal (Demo Operator's own host): {portal_url()}   user: {PORTAL_USER}   "
        f"password: {portal_password}",
        f"Operator API token: in {SECRETS / 'demo-operator-token'}",
        "Processes keep running for you to explore; `make stop` stops them.",
    ]


def api(method: str, path: str, token: str, body: dict | None = None, **headers: str) -> tuple[int, dict]:
    req = urllib.request.Request(  # noqa: S310 - http:// to our own local server only
        services.BASE_URL + path, method=method, data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json", **headers},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 - our own local server
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def onboard(token: str) -> list[dict]:
    tenants = []
    for slug, name in CUSTOMERS:
        # The demo ships no release: its customers run the examples installed with the runtime, on purpose.
        status, body = api("POST", "/api/v1/tenants", token, {"slug": slug, "name": name, "allow_no_release": True},
                           **{"Idempotency-Key": f"demo-{slug}"})
        if status not in (200, 202):
            raise SystemExit(f"onboarding {slug} failed: {status} {body.get('detail', body)}")
        verb = "accepted" if status == 202 else "already onboarded (same Idempotency-Key)"
        console.print(f"  POST /api/v1/tenants {slug}: {status} {verb}")
        tenants.append(body)
    return tenants


def wait_ready(token: str, tenants: list[dict], timeout_s: float = 180) -> list[dict]:
    latest = {t["id"]: t for t in tenants}
    with Progress(TextColumn("  {task.description:<12}"), BarColumn(), TextColumn("{task.fields[state]}"),
                  TimeElapsedColumn(), console=console) as progress:
        bars = {t["id"]: progress.add_task(t["slug"], total=len(RESOURCE_KINDS) + 1, state=t["status"])
                for t in tenants}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for tid in bars:
                _, latest[tid] = api("GET", f"/api/v1/tenants/{tid}", token)
                body = latest[tid]
                done = len(body.get("resources", [])) + (1 if body.get("status") == "ready" else 0)
                progress.update(bars[tid], completed=done, state=body.get("status"))
            if all(t.get("status") in ("ready", "failed") for t in latest.values()):
                break
            time.sleep(0.5)
    return list(latest.values())


def _short(external_id: str) -> str:
    return external_id.replace(ROOT.as_uri() + "/", "").replace(str(ROOT) + "/", "")


def show(tenants: list[dict], live: dict[str, dict]) -> None:
    """Each tenant's resources; the runtime row names the process running now (``live``, from its start)."""
    table = Table(title=f"Tenants of operator {OPERATOR}: one isolated instance each", show_lines=False)
    table.add_column("tenant", style="bold")
    table.add_column("resource")
    table.add_column("external id", overflow="fold")
    table.add_column("status")
    table.add_column("isolation")
    for t in tenants:
        inst = t.get("instance") or {}
        reason = f" ({t['status_reason']})" if t.get("status_reason") else ""
        table.add_row(t["slug"], "tenant", t["id"], t["status"] + reason, "")
        isolation = "-"
        for r in t.get("resources", []):
            external_id = live.get(t["slug"], {}).get("external_id") if r["kind"] == "runtime" else None
            table.add_row("", r["kind"], _short(external_id or r["external_id"]), r["status"], "")
            isolation = r.get("isolation") or isolation if r["kind"] == "runtime" else isolation
        style = "green" if isolation == "sandboxed" else "yellow"
        table.add_row("", "instance", inst.get("endpoint", "") or "-", inst.get("status", "-"),
                      f"[{style}]{isolation}[/]", end_section=True)
    console.print(table)


def instance(action: str, slug: str, *extra: str) -> dict:
    done = manage("instance", action, f"{OPERATOR}/{slug}", *extra, check=False)
    if done.returncode != 0:
        raise SystemExit(f"instance {action} {slug} failed: {done.stderr.strip()}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def instances_start(tenants: list[dict]) -> dict[str, dict]:
    """Each tenant's running instance, by slug: a no-op for a running one, a start after `make stop`. The answer
    names the live process (the runtime resource may still name one a planned stop ended)."""
    return {t["slug"]: instance("start", t["slug"]) for t in tenants}


def _at(iso: str) -> datetime:
    return datetime.fromisoformat(iso)


def task_get(token: str, tenant_id: str, task_id: str) -> dict:
    """The task as the tenant API shows it (status, steps, step events, effects); {} while its instance is down."""
    status, body = api("GET", f"/api/v1/tenants/{tenant_id}/tasks/{task_id}", token)
    return body if status == 200 else {}


def kill_landed_mid_step(events: list[dict], step: str, killed_at: datetime) -> datetime | None:
    """From a task's step events (oldest first): when ``step`` started again after a kill that cut it short.

    Cut short means the step's last event before the kill is a 'start' and its next one a 'start' again (no
    'done' between: the killed attempt wrote nothing more). None when the kill did not land inside the step.
    """
    mine = [(e["event"], _at(e["at"])) for e in events if e["step"] == step]
    before = [i for i, (_, at) in enumerate(mine) if at < killed_at]
    if not before or mine[before[-1]][0] != "start":
        return None
    after = mine[before[-1] + 1:]
    return after[0][1] if after and after[0][0] == "start" else None


def detected_by(detail: str) -> str:
    """How the control plane noticed the exit, from the recovery event's detail."""
    if "noticed by its parent" in detail:
        return "the exit notice of the process that started it"
    if "watch" in detail:
        return "the exit watcher"
    if "heartbeat" in detail:
        return "the heartbeat sweep"
    return "the recovery sweep"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return None  # the 302 itself is the answer; the page it points to is not needed


class StaffDashboard:
    """The staff dashboard, signed in as the demo's staff user: the drill presses its "Kill the instance" button
    (a SIGKILL through the running web server, so it lands a few milliseconds after it is decided)."""

    def __init__(self, password: str) -> None:
        self._opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(), _NoRedirect())
        self.signed_in = False
        token = self._token("/dashboard/login/")
        if token:
            status, _ = self._post("/dashboard/login/", {"username": "admin", "password": password,
                                                         "csrfmiddlewaretoken": token})
            self.signed_in = status == 302

    def _token(self, path: str) -> str:
        try:
            with self._opener.open(services.BASE_URL + path, timeout=30) as resp:
                page = resp.read().decode()
        except urllib.error.URLError:
            return ""
        found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        return found.group(1) if found else ""

    def _post(self, path: str, fields: dict[str, str]) -> tuple[int, str]:
        req = urllib.request.Request(services.BASE_URL + path,  # noqa: S310 - our own local server
                                     data=urllib.parse.urlencode(fields).encode(), method="POST")
        try:
            with self._opener.open(req, timeout=30) as resp:
                return resp.status, ""
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers.get("Location", "")

    def kill_form(self, tenant_id: str) -> str:
        """The kill button's form token, fetched before the moment to press it comes."""
        return self._token(f"/dashboard/tenants/{tenant_id}/actions/kill/") if self.signed_in else ""

    def kill(self, tenant_id: str, form_token: str) -> bool:
        status, location = self._post(f"/dashboard/tenants/{tenant_id}/actions/kill/",
                                      {"csrfmiddlewaretoken": form_token})
        return status == 302 and location.rstrip("/").endswith(tenant_id)


def sink_records() -> list[dict]:
    """What the SMTP sink received, one record per message (its subject names the demo task)."""
    log = Path(services.SINK_ENV["AGENT_SMTP_SINK_LOG"])
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []


def charges_by_key() -> dict[str, int]:
    """Charges the payment peer made, by idempotency key (the ledger's key of the step that paid)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{services.PAYMENTS_PORT}/stats", timeout=5) as resp:  # noqa: S310
        return json.loads(resp.read())["charges_by_key"]


def wait_tasks(token: str, tenants: list[dict], tasks: dict[str, str], timeout_s: float = 240) -> dict[str, dict]:
    """Each task's detail once every one has ended (or at the deadline)."""
    details: dict[str, dict] = {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for t in tenants:
            if details.get(t["slug"], {}).get("task", {}).get("status") not in TASK_ENDED:
                details[t["slug"]] = task_get(token, t["id"], tasks[t["slug"]]) or details.get(t["slug"], {})
        if all(d.get("task", {}).get("status") in TASK_ENDED for d in details.values()):
            break
        time.sleep(0.5)
    return details


def kill_mid_step(victim: dict, task: str, token: str, dashboard: StaffDashboard) -> datetime | None:
    """Wait for DRILL_STEP of the victim's task to start (its step event), then SIGKILL the instance while it
    runs. Returns when the kill was sent, or None if the task ended (or never got there) first."""
    form = dashboard.kill_form(victim["id"])
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        detail = task_get(token, victim["id"], task)
        start = next((e for e in detail.get("events", []) if e["step"] == DRILL_STEP and e["event"] == "start"), None)
        if start is not None:
            break
        if detail.get("task", {}).get("status") in TASK_ENDED:
            return None
        time.sleep(0.1)
    else:
        return None
    killed_at = datetime.now(UTC)
    if form and dashboard.kill(victim["id"], form):
        how = "the staff dashboard's Kill button"
    else:  # no staff session (a staff user made before var/secrets): the same kill, from a command
        instance("kill", victim["slug"])
        how = "manage.py instance kill"
    console.print(f"  [bold red]SIGKILL[/] {victim['slug']}'s agent-host (pid {victim['pid']}) while its step "
                  f"'{DRILL_STEP}' runs ({(killed_at - _at(start['at'])).total_seconds():.1f} s after its start "
                  f"event), through {how}")
    return killed_at


def watch_recovery(victim: dict, task: str, token: str, killed_at: datetime) -> tuple[dict, datetime | None]:
    """The recovery that followed the kill and when the killed step started again (None: it did not)."""
    console.print("  nobody restarts it by hand: the control plane has to notice the exit on its own ...")
    event: dict = {}
    resumed: datetime | None = None
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        _, listed = api("GET", f"/api/v1/tenants/{victim['id']}/recoveries", token)
        event = next((e for e in listed.get("results", []) if _at(e["detected_at"]) >= killed_at), {})
        detail = task_get(token, victim["id"], task)
        resumed = kill_landed_mid_step(detail.get("events", []), DRILL_STEP, killed_at) or resumed
        if event.get("outcome") in ("succeeded", "failed", "quarantined") and (
                resumed or detail.get("task", {}).get("status") in TASK_ENDED):
            break
        time.sleep(0.25)
    if event:
        console.print(f"  detected by {detected_by(event.get('detail', ''))} "
                      f"({(_at(event['detected_at']) - killed_at).total_seconds():.1f} s after the kill: "
                      f"\"{event.get('detail', '')}\")")
        console.print(f"  recovery: reason {event.get('reason')}, outcome {event.get('outcome')}, resumed from "
                      f"checkpoint {event.get('from_checkpoint') or '-'}, steps lost {event.get('steps_lost')}")
    else:
        console.print("  [red]no recovery was recorded after the kill")
    if resumed:
        console.print(f"  [bold]time to recover: {(resumed - killed_at).total_seconds():.1f} s[/] from the SIGKILL to "
                      f"step '{DRILL_STEP}' running again (detection included)")
    return event, resumed


def run_demo_job(tenants: list[dict], live: dict[str, dict], token: str, password: str) -> tuple[bool, bool]:
    """Run the demo job everywhere and SIGKILL one instance in the middle of a step; (exactly once, the kill
    landed mid-step and the step ran again)."""
    console.rule("Demo job: search (cached tool), write files, scan judgment, email, payment")
    for t in tenants:
        # The job re-checks its mail credential with the vault at the moment of use (write-only API).
        status, body = api("PUT", f"/api/v1/tenants/{t['id']}/credentials/smtp", token,
                           {"value": f"demo-smtp-secret-{t['slug']}"})
        if status not in (200, 201):
            raise SystemExit(f"storing the smtp credential of {t['slug']} failed: {status} {body}")
    console.print("  stored each tenant's smtp credential through PUT /api/v1/tenants/{id}/credentials/smtp")
    victim = {**tenants[0], "pid": live[tenants[0]["slug"]].get("pid", "?")}
    dashboard = StaffDashboard(password)
    params = json.dumps(DEMO_TASK_PARAMS)
    tasks: dict[str, str] = {}
    for t in [*tenants[1:], tenants[0]]:  # the victim's last: its steps are watched from their first event
        tasks[t["slug"]] = instance("submit", t["slug"], "--kind", "demo", "--params", params)["task"]
        console.print(f"  submitted demo task {tasks[t['slug']]} to {t['slug']}")
    killed_at = kill_mid_step(victim, tasks[victim["slug"]], token, dashboard)
    event: dict = {}
    resumed = None
    if killed_at is None:
        console.print(f"  [red]the task of {victim['slug']} ended before its step '{DRILL_STEP}' was seen running: "
                      "nothing was killed")
    else:
        event, resumed = watch_recovery(victim, tasks[victim["slug"]], token, killed_at)
    details = wait_tasks(token, tenants, tasks)
    mail = sink_records()
    charges = charges_by_key()
    table = Table(title="After the kill: every task finished, every effect happened once")
    for col in ("tenant", "demo task", "tasks", "agent-host boots", "emails sent", "payments charged"):
        table.add_column(col)
    ok = bool(tasks)
    for t in tenants:
        task, detail = tasks[t["slug"]], details.get(t["slug"], {})
        sent = sum(1 for m in mail if m.get("subject") == f"Report {task}")
        keys = [e["key"] for e in detail.get("effects", []) if e["effect"] == "payment"]
        charged = sum(charges.get(k, 0) for k in keys)
        summary = instance("tasks", t["slug"])
        starts = Counter(e["step"] for e in detail.get("events", []) if e["event"] == "start")
        restarts = sum(n - 1 for n in starts.values())
        table.add_row(t["slug"] + (" (killed)" if t["slug"] == victim["slug"] else ""),
                      detail.get("task", {}).get("status", "?") + (f", {restarts} step re-run" if restarts else ""),
                      ", ".join(f"{n} {k}" for k, n in summary["tasks"].items()), str(summary["boots"]),
                      str(sent), f"{charged}" + (f" ({len(keys)} keys)" if len(keys) != 1 else ""))
        ok = ok and detail.get("task", {}).get("status") == "done" and sent == 1 and len(keys) == 1 and charged == 1
    console.print(table)
    ok = ok and event.get("outcome") == "succeeded"
    mid_step = killed_at is not None and resumed is not None
    console.print(f"Killed mid-step: {'[green]yes' if mid_step else '[red]NO'}[/] (step '{DRILL_STEP}' of "
                  f"{victim['slug']}'s task: started before the kill, cut short, started again after it)")
    console.print("[green]Exactly once: yes[/]" if ok else "[red]Exactly once: NO[/]")
    return ok, mid_step


def _customer_browser(authorization_url: str) -> tuple[int, str]:
    """What the customer's browser does: open the provider's consent page, press Allow, follow the provider's
    redirect to the control plane's callback. (status, title) of the page the callback answers."""
    opener = urllib.request.build_opener(_NoRedirect())
    with opener.open(authorization_url, timeout=30) as resp:  # the consent page
        page = resp.read().decode()
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', page))
    fields = {k: html.unescape(v) for k, v in fields.items()}
    form = urllib.request.Request(authorization_url.split("?", 1)[0], method="POST",  # noqa: S310 - local peer
                                  data=urllib.parse.urlencode({**fields, "decision": "allow"}).encode())
    try:
        opener.open(form, timeout=30)
        return 0, "the provider did not redirect back"
    except urllib.error.HTTPError as redirect:
        callback = redirect.headers.get("Location", "")
    try:
        with opener.open(callback, timeout=60) as resp:
            done = resp.read().decode()
            status = resp.status
    except urllib.error.HTTPError as refused:
        done, status = refused.read().decode(), refused.code
    title = re.search(r"<h1>([^<]*)</h1>", done)
    return status, title.group(1) if title else ""


def connect_account(tenants: list[dict], token: str) -> bool:
    """One customer connects its own account at the example OAuth server (started by the operator's front end with
    a customer token, consent at the provider, the callback on the control plane), then its `calendar` agent reads
    the calendar with it. The provider counts the calls and any refresh-token reuse; no token is ever printed."""
    console.rule("Connected account: a customer connects its account at an OAuth provider; the agent uses it")
    t = tenants[1] if len(tenants) > 1 else tenants[0]
    issuer = f"http://127.0.0.1:{services.OAUTH_PORT}"
    secret = Path(services.SINK_ENV["AGENT_OAUTH_CLIENT_SECRET_FILE"]).read_text().strip()
    status, body = api("POST", "/api/v1/oauth-clients", token,
                       {"provider": OAUTH_PROVIDER, "client_id": services.OAUTH_CLIENT_ID, "client_secret": secret,
                        "issuer": issuer, "scopes": ["openid", "email", "calendar"]})
    if status not in (201, 409):  # 409: registered by an earlier run
        console.print(f"  [red]registering the OAuth client failed: {status} {body}")
        return False
    console.print(f"  the operator's OAuth client at {issuer} (discovered from its issuer; the secret write-only)",
                  highlight=False)
    status, minted = api("POST", f"/api/v1/tenants/{t['id']}/customer-tokens", token,
                         {"scopes": ["connections:read", "connections:write"], "ttl_s": 300})
    if status != 201:
        console.print(f"  [red]minting the customer token failed: {status} {minted}")
        return False
    customer = minted["token"]
    status, started = api("POST", f"/api/v1/tenants/{t['id']}/connections", customer, {"provider": OAUTH_PROVIDER})
    if status != 201:
        console.print(f"  [red]starting the connect flow failed: {status} {started}")
        return False
    page_status, title = _customer_browser(started["authorization_url"])
    console.print(f"  {t['slug']}'s customer: Connect -> the provider's consent page -> Allow -> callback: "
                  f"{page_status} {title!r}")
    _, listed = api("GET", f"/api/v1/tenants/{t['id']}/connections", customer)
    active = [c for c in (listed if isinstance(listed, list) else []) if c["provider"] == OAUTH_PROVIDER
              and c["status"] == "active"]
    if page_status != 200 or not active:
        console.print(f"  [red]not connected: {listed}")
        return False
    shown = active[0]
    console.print(f"  connection: {shown['provider']} account {shown['account_id']}, {shown['status']}, scopes "
                  f"{' '.join(shown['scopes'])}, token expires {shown['expires_at']} (the token itself: never shown)")
    task = instance("submit", t["slug"], "--kind", "calendar", "--params", "{}")["task"]
    detail: dict = {}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        detail = task_get(token, t["id"], task) or detail
        if detail.get("task", {}).get("status") in TASK_ENDED:
            break
        time.sleep(0.5)
    with urllib.request.urlopen(f"{issuer}/stats", timeout=10) as resp:  # noqa: S310 - the local peer
        stats = json.loads(resp.read())
    result = detail.get("result") or {}
    done = detail.get("task", {}).get("status") == "done" and bool(result.get("events"))
    console.print(f"  agent 'calendar' task {task}: {detail.get('task', {}).get('status', '?')}; read "
                  f"{len(result.get('events', []))} event(s) of {result.get('account', '?')} with "
                  "ctx.connections.get('example-oauth').access_token()")
    clean = stats["resource_refused"] == 0 and stats["reuse_detected"] == 0 and stats["revoked_families"] == 0
    console.print(f"  at the provider: {stats['resource_calls']} API call(s), {stats['resource_refused']} refused; "
                  f"refresh-token reuse {stats['reuse_detected']}, families revoked {stats['revoked_families']}")
    console.print("[green]Connected account used: yes[/]" if done and clean else "[red]Connected account used: NO[/]")
    return done and clean


def mcp_server_register(t: dict, token: str) -> bool:
    """Give the customer the example CRM's MCP server: its token as a credential, the server in the registry (one
    allowed tool), the support agent's configuration naming it. Each write is a no-op on a re-run: the credential
    is put again (same value), the entry re-created only when it points elsewhere (a run on another port), the
    configuration's other keys kept."""
    secret = Path(services.SINK_ENV["MCP_PEER_TOKEN_FILE"]).read_text().strip()
    status, body = api("PUT", f"/api/v1/tenants/{t['id']}/credentials/{MCP_CREDENTIAL}", token, {"value": secret})
    if status not in (200, 201):
        console.print(f"  [red]storing the {MCP_CREDENTIAL} credential failed: {status} {body}")
        return False
    _, listed = api("GET", f"/api/v1/tenants/{t['id']}/mcp-servers", token)
    mine = [s for s in (listed if isinstance(listed, list) else [])
            if s["name"] == MCP_SERVER and s["scope"] == "tenant"]
    wanted = {"name": MCP_SERVER, "url": services.CRM_URL, "credential": MCP_CREDENTIAL, "allowed_tools": [MCP_TOOL]}
    if mine and any(mine[0][k] != v for k, v in wanted.items()):
        api("DELETE", f"/api/v1/tenants/{t['id']}/mcp-servers/{mine[0]['id']}", token)
        mine = []
    if not mine:
        status, body = api("POST", f"/api/v1/tenants/{t['id']}/mcp-servers", token, wanted)
        if status not in (201, 409):  # 409: registered meanwhile by another run
            console.print(f"  [red]registering the MCP server failed: {status} {body}")
            return False
    console.print(f"  POST /api/v1/tenants/{{id}}/mcp-servers: {MCP_SERVER!r} at {services.CRM_URL} for {t['slug']}, "
                  f"token from its credential {MCP_CREDENTIAL!r}, allowed tool {MCP_TOOL}"
                  + ("" if not mine else " (registered earlier)"), markup=False, highlight=False)
    status, config = api("GET", f"/api/v1/tenants/{t['id']}/agent-config", token)
    overrides = dict(config.get("overrides") or {}) if status == 200 else {}
    if status == 200 and overrides.get("mcp_server") != MCP_SERVER:
        status, config = api("PUT", f"/api/v1/tenants/{t['id']}/agent-config", token,
                             {"overrides": {**overrides, "mcp_server": MCP_SERVER}})
    if status != 200:
        console.print(f"  [red]setting the agent configuration's mcp_server failed: {status} {config}")
        return False
    console.print(f"  PUT /api/v1/tenants/{{id}}/agent-config: the support agent's mcp_server is {MCP_SERVER!r}",
                  highlight=False)
    return True


def crm_calls(contact: str) -> int:
    """The calls of the MCP tool the CRM's server received for ``contact`` (its own count, from its call log)."""
    secret = Path(services.SINK_ENV["MCP_PEER_TOKEN_FILE"]).read_text().strip()
    req = urllib.request.Request(f"http://127.0.0.1:{services.CRM_PORT}/stats",  # noqa: S310 - the local peer
                                 headers={"Authorization": f"Bearer {secret}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - the local peer
            return int(json.loads(resp.read())["upsert_contact_by_email"].get(contact, 0))
    except (OSError, ValueError, KeyError):
        return 0


def talk(tenants: list[dict], token: str) -> tuple[bool, bool]:
    """A customer talks to its agent through the tenant API: a message, its reply streamed as it is produced. The
    message gives an email address, so the support agent records the contact with the CRM's MCP tool. (replied,
    the MCP tool was used)."""
    console.rule("Talk to an agent: POST a message, stream the reply (server-sent events); the agent calls an MCP tool")
    t = tenants[-1]
    # The support agent answers with an OpenAI-compatible model (the local peer); its key is a tenant credential.
    status, body = api("PUT", f"/api/v1/tenants/{t['id']}/credentials/openai", token, {"value": services.CHAT_API_KEY})
    if status not in (200, 201):
        console.print(f"  [red]storing the openai credential failed: {status} {body}")
        return False, False
    registered = mcp_server_register(t, token)
    contact = f"jane@{t['slug']}.example"
    question = f"Where is my order 1042? My email is {contact}."
    status, sent = api("POST", f"/api/v1/tenants/{t['id']}/threads/{CHAT_THREAD}/messages", token,
                       {"content": question}, **{"Idempotency-Key": f"demo-talk-mcp-{CHAT_THREAD}-{t['id']}"})
    if status not in (200, 201, 202):
        console.print(f"  [red]POST message failed: {status} {sent}")
        return False, False
    console.print(f"  {t['slug']} customer: {question}  ({status}, message {sent['inbox']['id']})")
    req = urllib.request.Request(urllib.parse.urljoin(services.BASE_URL, sent["reply_url"]),  # noqa: S310
                                 headers={"Authorization": f"Bearer {token}", "Accept": "text/event-stream"})
    reply, event = "", ""
    deadline = time.monotonic() + 180  # a loaded machine: a first task, three completions, two tools
    while not reply and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(req, timeout=90) as resp:  # noqa: S310
                for raw in resp:
                    line = raw.decode().rstrip("\n")
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: ") and event == "reply":
                        reply = json.loads(line[6:])["content"]
                        break
        except (OSError, ValueError) as exc:  # the stream ended early or timed out: ask again until the deadline
            console.print(f"  (reply stream: {exc}; asking again)", highlight=False)
            time.sleep(1)
    console.print(f"  agent: {reply or '(no reply yet: see the dashboard)'}")
    console.print(f"  the conversation is in the portal's chat: {portal_url()}customers/{t['id']}/", markup=False,
                  highlight=False, soft_wrap=True)
    calls = crm_calls(contact) if registered else 0
    console.print(f"  at the CRM's MCP server: {MCP_TOOL} received {calls} call(s) for {contact} (an idempotent "
                  "tool: called again, never cached, if a crash cuts the step short)", highlight=False)
    used = registered and calls >= 1
    console.print("[green]MCP tool used: yes[/]" if used else "[red]MCP tool used: NO[/]")
    return bool(reply), used


def main() -> int:
    console.rule("[bold]Agent control plane demo")
    # Before the first process (migrate below) so no two processes ever race to generate them.
    services.secrets_ensure()
    console.print("Starting the embedded PostgreSQL and migrating ...")
    os.environ.setdefault("CONTROL_PLANE_INTERNAL_URL", services.BASE_URL)
    migrated = manage("migrate", "--no-input", check=False)
    if migrated.returncode != 0:
        console.print(migrated.stderr)
        return 1
    console.print("Starting web, worker and beat ...")
    services.start()
    pooler = services.pgbouncer_port()
    if pooler is not None:
        console.print(f"  tenant database: instances connect through PgBouncer in transaction mode (127.0.0.1:{pooler}"
                      "), holding no idle server session (EMBEDDED_PGBOUNCER)")
    else:
        console.print("  tenant database: instances connect to PostgreSQL directly (PgBouncer not installed or "
                      "EMBEDDED_PGBOUNCER=false)")
    token = operator_token()
    password = staff_password()
    portal = portal_password()
    console.print("Onboarding three customers through the REST API ...")
    tenants = wait_ready(token, onboard(token))
    failed = [t["slug"] for t in tenants if t["status"] != "ready"]
    live = {} if failed else instances_start(tenants)
    show(tenants, live)
    exactly_once, mid_step = run_demo_job(tenants, live, token, password) if not failed else (False, False)
    connected = not failed and connect_account(tenants, token)
    talked, mcp_used = talk(tenants, token) if not failed else (False, False)
    console.print()
    for line in closing_lines(staff_password=password, portal_password=portal):
        console.print(line, markup=False, highlight=False, soft_wrap=True)  # a URL is never wrapped
    if failed:
        console.print(f"[red]Not ready: {', '.join(failed)} (see the admin's workflow runs and {LOG / 'worker.log'})")
        return 1
    if not (exactly_once and mid_step and connected and talked and mcp_used):
        console.print(f"[red]Something went wrong: see {LOG / 'worker.log'} and {LOG / 'web.log'}, and the "
                      f"instances' own logs ({services.VAR / 'volumes'}/*/.host/agent-host.log)", soft_wrap=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
