"""``make demo``: onboard three customers through the REST API on the embedded default and show them.

Starts (or reuses) the embedded PostgreSQL, the web server, a Celery worker and beat;
creates a demo operator and a staff user; onboards three customers over HTTP with
idempotency keys (so re-running the demo creates nothing twice); shows progress until
every instance is ready; prints each tenant's resources and where to look next.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
import services  # noqa: E402

ROOT = services.ROOT
SECRETS = services.VAR / "secrets"
CUSTOMERS = [("acme-corp", "Acme Corp"), ("globex", "Globex Corporation"), ("initech", "Initech")]
RESOURCE_KINDS = ("database", "volume", "objectstore", "vault", "runtime")
console = Console()


def manage(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, capture_output=True, text=True,
                          check=check)


def secret_file(name: str, produce) -> str:  # type: ignore[no-untyped-def]
    """A demo credential kept in var/secrets (0600) so re-runs can reuse it."""
    path = SECRETS / name
    if path.exists():
        return path.read_text().strip()
    value = produce()
    SECRETS.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.write_text(value)
    path.chmod(0o600)
    return value


def operator_token() -> str:
    def produce() -> str:
        done = manage("create_operator", "demo-ops", "--name", "Demo Operator", "--domain", "localhost", check=False)
        if done.returncode != 0:
            done = manage("create_operator_token", "demo-ops")
        return done.stdout.strip().splitlines()[-1]

    return secret_file("demo-operator-token", produce)


def staff_password() -> str:
    def produce() -> str:
        out = manage("ensure_staff_user", "admin").stdout.strip()
        return out.splitlines()[-1] if out else "(created earlier: see var/secrets)"

    return secret_file("admin-password", produce)


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
    table = Table(title="Tenants of operator demo-ops: one isolated instance each", show_lines=False)
    table.add_column("tenant", style="bold")
    table.add_column("resource")
    table.add_column("external id", overflow="fold")
    table.add_column("status")
    for t in tenants:
        inst = t.get("instance") or {}
        reason = f" ({t['status_reason']})" if t.get("status_reason") else ""
        table.add_row(t["slug"], "tenant", t["id"], t["status"] + reason)
        for r in t.get("resources", []):
            table.add_row("", r["kind"], _short(r["external_id"]), r["status"])
        table.add_row("", "instance", inst.get("endpoint", "") or "-", inst.get("status", "-"), end_section=True)
    console.print(table)


def main() -> int:
    console.rule("[bold]Agent control plane demo")
    console.print("Starting the embedded PostgreSQL and migrating ...")
    os.environ.setdefault("CONTROL_PLANE_INTERNAL_URL", services.BASE_URL)
    migrated = manage("migrate", "--no-input", check=False)
    if migrated.returncode != 0:
        console.print(migrated.stderr)
        return 1
    console.print("Starting web, worker and beat ...")
    services.start()
    token = operator_token()
    password = staff_password()
    console.print("Onboarding three customers through the REST API ...")
    tenants = wait_ready(token, onboard(token))
    show(tenants)
    failed = [t["slug"] for t in tenants if t["status"] != "ready"]
    console.print(f"\nAPI docs (Swagger UI): {services.BASE_URL}/api/docs/   OpenAPI: {services.BASE_URL}/api/schema/")
    console.print(f"Admin: {services.BASE_URL}/admin/   user: admin   password: {password}")
    console.print(f"Operator API token: in {SECRETS / 'demo-operator-token'}")
    console.print("Processes keep running for you to explore; `make stop` stops them.")
    if failed:
        console.print(f"[red]Not ready: {', '.join(failed)} (see the admin's workflow runs and var/log/worker.log)")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
