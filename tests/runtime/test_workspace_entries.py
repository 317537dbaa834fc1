"""The workspace digest covers every kind of entry a judgment may depend on, and refuses the entries it
cannot vouch for: symlinks that leave the workspace and device nodes."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from agent_runtime.errors import WorkspaceRefused
from agent_runtime.host.runner import Runtime, run_task
from agent_runtime.sdk import Agent, Context
from agent_runtime.state import tasks
from agent_runtime.state.workspace import tree_digest


def test_kind_mode_and_content_of_every_entry_change_the_digest(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "report.md").write_text("clean")
    base = tree_digest(ws)
    digests = {base}
    (ws / "report.md").chmod(0o600)
    digests.add(tree_digest(ws))
    (ws / "report.md").write_text("dirty")
    digests.add(tree_digest(ws))
    (ws / "sub").mkdir()
    digests.add(tree_digest(ws))
    (ws / "sub" / "link").symlink_to("../report.md")  # inside the workspace: covered, target digested too
    digests.add(tree_digest(ws))
    os.mkfifo(ws / "pipe")
    with_fifo = tree_digest(ws)
    digests.add(with_fifo)
    os.unlink(ws / "pipe")
    (ws / "pipe").write_bytes(b"")  # an empty file where the FIFO was is not the same tree
    digests.add(tree_digest(ws))
    assert len(digests) == 7
    (ws / "report.md").write_text("dirty")  # same content again: same digest (no mtimes)
    assert tree_digest(ws) in digests


@pytest.mark.parametrize("make", ["outside_relative", "outside_absolute", "dangling_outside", "device"])
def test_entries_a_digest_cannot_vouch_for_are_refused(tmp_path: Path, make: str) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    secret = tmp_path / "outside.txt"
    secret.write_text("changes without the workspace noticing")
    if make == "outside_relative":
        (ws / "report.md").symlink_to("../outside.txt")
    elif make == "outside_absolute":
        (ws / "report.md").symlink_to(secret)
    elif make == "dangling_outside":
        (ws / "report.md").symlink_to("../../nowhere/x")
    else:
        os.mknod(ws / "disk", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    with pytest.raises(WorkspaceRefused, match="symlink to|device node"):
        tree_digest(ws)


linker = Agent("linker")


@linker.step
def fetch(ctx: Context) -> Any:
    (ctx.workdir / "report.md").symlink_to(ctx.params["outside"])
    return True


@linker.step
def scan(ctx: Context) -> Any:  # pragma: no cover - never reached: the fetch step's checkpoint is refused
    return ctx.judge("scan", passed=True)


def test_a_step_that_links_outside_its_workspace_blocks_the_task(runtime: Runtime, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.md"
    outside.write_text("unscanned")
    tid = tasks.submit(runtime.conn, "linker", {"outside": str(outside)})
    assert run_task(runtime, linker, tid) == "blocked"
    task = tasks.get(runtime.conn, tid)
    assert task is not None and task.blocked_reason == "workspace_refused" and "outside the workspace" in (
        task.blocked_detail or "")
    assert runtime.conn.execute("SELECT count(*) FROM judgments").fetchone()[0] == 0
