"""`agent-host dev PATH`: the author's loop, run as the author runs it (real processes, its own embedded PostgreSQL).

A save reaches the next task, and the next step of a running task, within seconds and without a wheel; a SIGKILL
of the dev instance mid-task resumes from the checkpoint and performs each effect once; the state directory
keeps what a second run reads back.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from tests.runtime.harness import ROOT

pytestmark = pytest.mark.timeout(240)

PYPROJECT = """[build-system]
requires = ["setuptools>=69"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "0.1.0"

[project.entry-points."agent_runtime.agents"]
{entry_points}
"""

RELOAD_AGENT = '''
import time
from pathlib import Path

from agent_runtime.sdk import Agent

VERSION = "{version}"

agent = Agent("reload")
echo = Agent("echo", conversational=True)


@agent.step
def first(ctx):
    gate = ctx.params.get("gate")
    while gate and not Path(gate).exists():  # the test edits the source while this step runs
        time.sleep(0.05)
        ctx.progress()
    return {{"first": VERSION}}


@agent.step
def second(ctx):
    return {{"second": VERSION}}


@echo.step
def answer(ctx):
    ctx.reply(f"echo {{VERSION}}: {{ctx.params['question']}}")
'''

PAY_AGENT = '''
import json
import time
from pathlib import Path

from agent_runtime.sdk import Agent, LookupResult

PERFORMED = Path(__file__).parent / "performed.jsonl"


class Recorder:
    """A provider that remembers each key it acted on (as a payment API's idempotency record does)."""

    supports_lookup = True
    replay_safe = False
    lookup_consistency_s = 0.0

    def __init__(self, config, credentials):
        pass

    def perform(self, idem_key, args):
        with PERFORMED.open("a") as fh:
            fh.write(json.dumps({"key": idem_key, "args": args}) + "\\n")
        return {"id": idem_key}

    def lookup(self, idem_key):
        for line in PERFORMED.read_text().splitlines() if PERFORMED.exists() else []:
            if json.loads(line)["key"] == idem_key:
                return LookupResult.found({"id": idem_key})
        return LookupResult.absent()


agent = Agent("pay", effects={"charge": Recorder, "notify": Recorder})


@agent.step
def charge(ctx):
    return ctx.effect("charge", {"amount": 42})


@agent.step
def slow(ctx):
    for _ in range(20):
        time.sleep(0.1)
        ctx.progress()
    return {"slow": True}


@agent.step
def notify(ctx):
    return ctx.effect("notify", {"to": "ada@example.com"})
'''


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory outside pytest's base: as root, PostgreSQL runs as pgserver's own user, which must reach its
    data directory, and a pytest session starting meanwhile (another checkout's) makes /tmp/pytest-of-root 0700."""
    path = Path(tempfile.mkdtemp(prefix="agent-dev-test-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _write_package(src: Path, name: str, module: str, code: str, entry_points: str) -> None:
    (src / module).mkdir(parents=True, exist_ok=True)
    (src / "pyproject.toml").write_text(PYPROJECT.format(name=name, entry_points=entry_points))
    (src / module / "__init__.py").write_text(code)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "AGENT_"))}
    env.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", COLUMNS="200", TERM="dumb")
    return env


def _dev(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "agent_runtime.host", "dev", *map(str, args)]


class Prompt:
    """The interactive `dev` session, driven through its stdin; its output lines are collected as they come."""

    def __init__(self, src: Path, state: Path) -> None:
        self.proc = subprocess.Popen(_dev(src, "--state", state), env=_env(), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def expect(self, text: str, timeout_s: float = 60) -> float:
        """Wait for an output line containing ``text``; return when it came (monotonic)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.05)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            self.seen.append(line)
            if text in line:
                return time.monotonic()
        raise AssertionError(f"no line with {text!r} in:\n" + "\n".join(self.seen[-60:]))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.send("quit")
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def test_a_save_reaches_the_next_task_and_the_next_step_without_a_wheel(scratch: Path) -> None:
    tmp_path = scratch
    src, state = tmp_path / "reload-agent", tmp_path / "state"
    _write_package(src, "reload-agent", "reload_agent", RELOAD_AGENT.format(version="v1"),
                   'reload = "reload_agent:agent"\necho = "reload_agent:echo"')
    source = src / "reload_agent" / "__init__.py"
    prompt = Prompt(src, state)
    try:
        prompt.expect("instance ready")
        prompt.send("submit reload {}")
        prompt.expect('"second": "v1"')

        # A save, then the next task: the new code, within 5 s of the save.
        source.write_text(RELOAD_AGENT.format(version="v2"))
        saved = time.monotonic()
        prompt.send("submit reload {}")
        prompt.expect('"second": "v2"', timeout_s=30)
        elapsed = time.monotonic() - saved
        print(f"save -> next task done on the new code: {elapsed:.2f} s")
        assert elapsed < 5.0, f"the new code ran {elapsed:.1f} s after the save"

        # A save while a task runs its first step: its next step runs the new code.
        gate = tmp_path / "gate"
        prompt.send(f"submit reload {json.dumps({'gate': str(gate)})}")
        prompt.expect("step first start")
        source.write_text(RELOAD_AGENT.format(version="v3"))
        gate.touch()
        # The step that was running finished on the code it started with; the next one ran the saved code.
        prompt.expect('{"first": {"first": "v2"}, "second": {"second": "v3"}}', timeout_s=30)

        # A second `dev` on the same state attaches to this session's instance: chat through it.
        chat = subprocess.run(_dev(src, "--state", state, "--chat", "t1", "hello"), env=_env(),
                              capture_output=True, text=True, timeout=120)
        assert chat.returncode == 0, chat.stdout + chat.stderr
        assert "attached" in chat.stdout and "agent: echo v3: hello" in chat.stdout, chat.stdout

        # `kill` from the prompt: SIGKILL, restart, the read-back; `tasks` lists every task with its step events.
        prompt.send("kill")
        prompt.expect("instance restarted after SIGKILL")
        prompt.send("tasks")
        prompt.expect("first:start first:done second:start second:done")

        # A source that does not import: the previous code keeps running, and the author is told.
        source.write_text("def broken(:\n")
        prompt.send("submit reload {}")
        prompt.expect('"second": "v3"', timeout_s=30)
        log = (state / "host.log").read_text()
        assert "agent_reload_failed" in log and "SyntaxError" in log
    finally:
        prompt.close()
    assert prompt.proc.returncode == 0

    # No wheel, no build, no installed distribution: the source ran as it is.
    assert not list(tmp_path.rglob("*.whl")) and not list(src.rglob("*.egg-info")) and not (src / "build").exists()
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.version("reload-agent")


def test_a_sigkill_mid_task_resumes_with_each_effect_once_and_a_second_run_reads_it_back(scratch: Path) -> None:
    src = scratch / "pay-agent"
    _write_package(src, "pay-agent", "pay_agent", PAY_AGENT, 'pay = "pay_agent:agent"')
    done = subprocess.run(_dev(src, "--submit", "pay", "{}", "--wait", "--kill-after-step", "1"), env=_env(),
                          capture_output=True, text=True, timeout=180)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "SIGKILL instance pid" in out and "instance restarted after SIGKILL" in out, out
    assert "from its checkpoint after step charge" in out, out
    assert out.count("step charge start") == 1 and out.count("step slow start") == 2, out  # killed inside `slow`
    assert out.count("step notify start") == 1 and "done" in out, out
    performed = [json.loads(line) for line in (src / "pay_agent" / "performed.jsonl").read_text().splitlines()]
    assert sorted(json.dumps(p["args"], sort_keys=True) for p in performed) == [
        '{"amount": 42}', '{"to": "ada@example.com"}'], performed  # each effect once, the kill notwithstanding

    # The state stayed beside the package: the next run lists the task as done, with its step events.
    listing = subprocess.run(_dev(src, "--tasks"), env=_env(), capture_output=True, text=True, timeout=120)
    assert listing.returncode == 0, listing.stdout + listing.stderr
    assert (src / ".agent-dev" / "pgdata").is_dir()
    assert "pay" in listing.stdout and "done" in listing.stdout and "slow:start" in listing.stdout, listing.stdout
