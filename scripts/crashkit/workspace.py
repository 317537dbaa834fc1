"""A workspace restored under a running release step, after its `ctx.require_judgment()` passed: the release
must not send files nobody scanned. Counted at the SMTP relay (the release's subject names the files sent)."""

from __future__ import annotations

import threading
from pathlib import Path

from agent_runtime.db import connect
from agent_runtime.state import tasks
from agent_runtime.state.migrations import migrate
from agent_runtime.state.workspace import latest_snapshot, restore_snapshot

from .core import Kit, Outcome, attack, settled, tenant_store, wait_for


@attack("workspace-restore-mid-release",
        "the task's workspace restored to its pre-clean snapshot while the release step runs, after "
        "ctx.require_judgment() passed",
        "unscanned files in releases at the SMTP relay (unsafe); a release neither sent clean nor blocked = lost")
def workspace_restore_mid_release(kit: Kit, out: Outcome, runs: int) -> None:
    scratch = kit.scratch("workspace-restore")
    with kit.tenant() as t, kit.peers("workspace-restore-peers") as peers, \
            kit.hosts("workspace-restore-hosts") as hosts, connect(t.dsn, t.schema, autocommit=True) as conn:
        migrate(conn, t.schema)
        env = kit.host_env(t, scratch, AGENT_SMTP_URL=peers.smtp_url)
        store = tenant_store(env)
        hosts.start(env)
        hosts.wait_ready(env)
        for i in range(runs):
            judged, go = scratch / f"judged-{i}", scratch / f"go-{i}"
            tid = tasks.submit(conn, "ck_release", {"judged_file": str(judged), "go_file": str(go)})
            wait_for("the release step past its judgment check", judged.exists, 30)
            key, digest = latest_snapshot(conn, f"ck-pre-clean/{tid}")
            workdir = Path(env["AGENT_VOLUME"]) / "workspace" / "tasks" / str(tid)
            # An operator (or a restore job) puts the workspace back to before the cleanup, right now.
            restorer = threading.Thread(target=restore_snapshot, args=(store, key, workdir, digest), daemon=True)
            restorer.start()
            restorer.join(3)
            restored_first = not restorer.is_alive()
            go.touch()
            restorer.join(30)
            status, reason = settled(conn, tid, 30)
            releases = [e["subject"] for e in peers.emails() if e["subject"].startswith(f"release {tid}")]
            unscanned = sum("payload.bin" in s for s in releases)
            out.ours.unsafe += unscanned
            out.ours.dup += max(0, len(releases) - 1)
            blocked = status == "blocked" and reason == "judgment_invalid" and not releases
            sent_clean = status == "done" and len(releases) == 1 and not unscanned
            out.ours.lost += not (blocked or sent_clean)
            out.runs += 1
            if not restored_first:
                out.note("the restore waited for the release step to finish (the workspace was held)")
            kit.say(f"run {i + 1}/{runs}: restored {'mid-step' if restored_first else 'after the step'}: task "
                    f"{status}{f' ({reason})' if reason else ''}, {len(releases)} release(s), "
                    f"{unscanned} with unscanned files")
