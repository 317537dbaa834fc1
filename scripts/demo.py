"""``make demo``: onboard three customers through the REST API on the embedded default and show them.

Starts (or reuses) the embedded PostgreSQL, the web server, a Celery worker and beat;
creates a demo operator (its portal on ``demo-ops.localhost``, a name browsers and curl resolve
to this machine with no DNS or hosts-file entry), a staff user and a portal admin; onboards three
customers over HTTP with idempotency keys (so re-running the demo creates nothing twice); shows
progress until every instance is ready; prints each tenant's resources and where to look next.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
import services  # noqa: E402

from controlplane.secretfiles import read_or_create_secret  # noqa: E402  (services put the root on sys.path)

ROOT = services.ROOT
SECRETS = services.VAR / "secrets"
OPERATOR = "demo-ops"
# *.localhost is loopback by definition (RFC 6761) and not a control-plane host, so this name serves the portal.
PORTAL_HOST = f"{OPERATOR}.localhost"
PORTAL_USER = "demo-admin"
CUSTOMERS = [("acme-corp", "Acme Corp"), ("globex", "Globex Corporation"), ("initech", "Initech")]
RESOURCE_KINDS = ("database", "volume", "objectstore", "vault", "runtime")
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
        status, body = api("POST", "/api/v1/tenants", token, {"slug": slug, "name": name},
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


def show(tenants: list[dict]) -> None:
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
            table.add_row("", r["kind"], _short(r["external_id"]), r["status"], "")
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


def sink_counts() -> tuple[dict[str, int], int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{services.PAYMENTS_PORT}/stats", timeout=5) as resp:  # noqa: S310
        charges = json.loads(resp.read())["charges_by_key"]
    log = Path(services.SINK_ENV["AGENT_SMTP_SINK_LOG"])
    emails = len(log.read_text().splitlines()) if log.exists() else 0
    return charges, emails


def run_demo_job(tenants: list[dict], token: str) -> bool:
    """Run the demo job everywhere, SIGKILL one instance mid-task, start it again, check exactly-once."""
    console.rule("Demo job: search (cached tool), write files, scan judgment, email, payment")
    for t in tenants:  # idempotent: a no-op for running instances, a start after `make stop`
        instance("start", t["slug"])
        # The job re-checks its mail credential with the vault at the moment of use (write-only API).
        status, body = api("PUT", f"/api/v1/tenants/{t['id']}/credentials/smtp", token,
                           {"value": f"demo-smtp-secret-{t['slug']}"})
        if status not in (200, 201):
            raise SystemExit(f"storing the smtp credential of {t['slug']} failed: {status} {body}")
    console.print("  stored each tenant's smtp credential through PUT /api/v1/tenants/{id}/credentials/smtp")
    done_before = {t["slug"]: instance("tasks", t["slug"])["tasks"].get("done", 0) for t in tenants}
    charges_before, emails_before = sink_counts()
    params = json.dumps({"search_s": 0.5, "step_sleep_s": 0.6})
    tasks = {t["slug"]: instance("submit", t["slug"], "--kind", "demo", "--params", params)["task"] for t in tenants}
    for slug, task in tasks.items():
        console.print(f"  submitted demo task {task} to {slug}")
    victim = tenants[0]["slug"]
    started = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    time.sleep(2.0)
    killed = instance("kill", victim)["killed_pid"]
    console.print(f"  [bold red]SIGKILL[/] {victim}'s agent-host (pid {killed}) in the middle of its task")
    victim_id = next(t["id"] for t in tenants if t["slug"] == victim)
    console.print("  nobody restarts it by hand: the worker that started it notices the exit at once (the Celery "
                  "beat sweep is the fallback) ...")
    deadline = time.monotonic() + 120
    event: dict = {}
    while time.monotonic() < deadline:
        _, listed = api("GET", f"/api/v1/tenants/{victim_id}/recoveries", token)
        event = (listed.get("results") or [{}])[0]
        if event.get("outcome") in ("succeeded", "failed", "quarantined") and event.get("detected_at", "") > started:
            break
        time.sleep(0.5)
    if event.get("detail"):
        console.print(f"  detected: {event['detail']}")
    console.print(f"  recovery: reason {event.get('reason')}, outcome {event.get('outcome')}, resumed from "
                  f"checkpoint {event.get('from_checkpoint') or '-'}, steps lost {event.get('steps_lost')}, "
                  f"time to recover {event.get('time_to_recover_s') or 0:.1f} s")
    deadline = time.monotonic() + 120
    summary: dict[str, dict] = {}
    while time.monotonic() < deadline:
        summary = {t["slug"]: instance("tasks", t["slug"]) for t in tenants}
        if all(s["tasks"].get("done", 0) > done_before[slug] and not {"pending", "running"} & set(s["tasks"])
               for slug, s in summary.items()):
            break
        time.sleep(0.5)
    charges, emails = sink_counts()
    new_charges = {k: v for k, v in charges.items() if k not in charges_before}
    table = Table(title="After the kill: every task finished, every effect happened once")
    for col in ("tenant", "tasks", "agent-host boots", "emails sent", "payments charged"):
        table.add_column(col)
    for t in tenants:
        s = summary.get(t["slug"], {"tasks": {}, "boots": "?"})
        table.add_row(t["slug"] + (" (killed)" if t["slug"] == victim else ""),
                      ", ".join(f"{n} {k}" for k, n in s["tasks"].items()), str(s["boots"]), "", "")
    table.add_row("all", "", "", f"{emails - emails_before}", f"{sum(new_charges.values())} "
                  f"({len(new_charges)} distinct idempotency keys)")
    console.print(table)
    ok = (event.get("outcome") == "succeeded" and emails - emails_before == len(tenants)
          and len(new_charges) == len(tenants) and all(v == 1 for v in new_charges.values())
          and all(s["tasks"].get("done", 0) > done_before[slug] for slug, s in summary.items()))
    console.print("[green]Exactly once: yes[/]" if ok else "[red]Exactly once: NO[/]")
    return ok


def talk(tenants: list[dict], token: str) -> bool:
    """A customer talks to its agent through the tenant API: a message, its reply streamed as it is produced."""
    console.rule("Talk to an agent: POST a message, stream the reply (server-sent events)")
    t = tenants[-1]
    # The support agent answers with an OpenAI-compatible model (the local peer); its key is a tenant credential.
    status, body = api("PUT", f"/api/v1/tenants/{t['id']}/credentials/openai", token, {"value": services.CHAT_API_KEY})
    if status not in (200, 201):
        console.print(f"  [red]storing the openai credential failed: {status} {body}")
        return False
    question = "Where is my order 1042?"
    status, sent = api("POST", f"/api/v1/tenants/{t['id']}/threads/demo/messages", token, {"content": question},
                       **{"Idempotency-Key": f"demo-talk-{t['id']}"})
    if status not in (200, 201, 202):
        console.print(f"  [red]POST message failed: {status} {sent}")
        return False
    console.print(f"  {t['slug']} customer: {question}  ({status}, message {sent['inbox']['id']})")
    req = urllib.request.Request(urllib.parse.urljoin(services.BASE_URL, sent["reply_url"]),  # noqa: S310
                                 headers={"Authorization": f"Bearer {token}", "Accept": "text/event-stream"})
    reply, event = "", ""
    deadline = time.monotonic() + 90
    while not reply and time.monotonic() < deadline:
        with urllib.request.urlopen(req, timeout=90) as resp:  # noqa: S310
            for raw in resp:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: ") and event == "reply":
                    reply = json.loads(line[6:])["content"]
                    break
    console.print(f"  agent: {reply or '(no reply yet: see the dashboard)'}")
    return bool(reply)


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
    show(tenants)
    failed = [t["slug"] for t in tenants if t["status"] != "ready"]
    job_ok = not failed and run_demo_job(tenants, token)
    talked = not failed and talk(tenants, token)
    console.print()
    for line in closing_lines(staff_password=password, portal_password=portal):
        console.print(line, markup=False, highlight=False, soft_wrap=True)  # a URL is never wrapped
    if failed:
        console.print(f"[red]Not ready: {', '.join(failed)} (see the admin's workflow runs and var/log/worker.log)")
        return 1
    return 0 if job_ok and talked else 1


if __name__ == "__main__":
    raise SystemExit(main())
