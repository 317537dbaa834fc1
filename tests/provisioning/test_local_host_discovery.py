"""How the local driver finds a tenant's agent-host inside its sandbox, with real processes.

Found on a busy machine (``make demo`` with both cores taken): right after spawning the sandbox the driver
read ``/proc/<pid>/environ`` without the tenant's id (``Popen`` returns once the child releases its old memory
in ``execve``, before the kernel has laid out the new environment; on an idle machine the window is too short
to hit), concluded "not this tenant's process" and failed the start with "the instance sandbox did not start
agent-host" while the host came up a moment later. The next attempt then found that host through the sandbox
but left the pid file naming the sandbox, so the port the host published was never believed and onboarding
failed after every retry. The window is modelled here by a process that shows another environment first and
then execs into the sandbox under the same pid.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from provisioning.drivers.local_process import HOST_MODULE, _is_tenant_host, _sandbox_host

_SANDBOX = "import subprocess, sys; subprocess.run([sys.executable, '-m', sys.argv[1]])"


@pytest.fixture
def fake_host_package(tmp_path: Path) -> Path:
    """A stand-in for the host module that only sleeps: its command line is exactly a host's."""
    pkg = tmp_path.joinpath(*HOST_MODULE.split("."))
    pkg.mkdir(parents=True)
    for parent in [tmp_path.joinpath(*HOST_MODULE.split(".")[:i]) for i in range(1, len(HOST_MODULE.split(".")))]:
        (parent / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text("import time\ntime.sleep(60)\n")
    return tmp_path


def _spawn(tenant_id: str, pythonpath: Path, *, exec_delay_s: float) -> subprocess.Popen[bytes]:
    """A "sandbox" (a process that runs the fake host as its child) which first shows the caller's environment
    for ``exec_delay_s``, then execs into the tenant's environment under the same pid."""
    env = {"PATH": os.environ.get("PATH", ""), "AGENT_TENANT_ID": tenant_id, "PYTHONPATH": str(pythonpath)}
    later = (f"import os, sys, time; time.sleep({exec_delay_s}); "
             f"os.execve(sys.executable, [sys.executable, '-c', {_SANDBOX!r}, {HOST_MODULE!r}], {env!r})")
    # cwd: ``-m`` looks in the current directory first, where the real package would be found instead.
    return subprocess.Popen([sys.executable, "-c", later], cwd=pythonpath, start_new_session=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    for child in psutil.Process(proc.pid).children(recursive=True):
        child.kill()
    proc.kill()
    proc.wait(10)


def test_a_sandbox_that_has_not_exec_d_yet_is_waited_for(fake_host_package: Path) -> None:
    tenant_id = str(uuid.uuid4())
    assert os.environ.get("AGENT_TENANT_ID") != tenant_id
    proc = _spawn(tenant_id, fake_host_package, exec_delay_s=1.5)
    try:
        time.sleep(0.2)  # forked, not exec'd: /proc shows this test's environment
        assert psutil.Process(proc.pid).environ().get("AGENT_TENANT_ID") != tenant_id
        host = _sandbox_host(proc.pid, tenant_id, wait_s=15)
        assert host is not None and host != proc.pid and _is_tenant_host(host, tenant_id)
        assert psutil.Process(host).ppid() == proc.pid
        assert psutil.Process(host).cwd() == str(fake_host_package)  # the stand-in, not a real agent-host
    finally:
        _stop(proc)


def test_a_process_of_another_tenant_or_program_is_never_taken_for_the_host(fake_host_package: Path) -> None:
    other = _spawn(str(uuid.uuid4()), fake_host_package, exec_delay_s=0)
    try:
        assert _sandbox_host(other.pid, str(uuid.uuid4()), wait_s=1.0) is None
        assert _sandbox_host(other.pid, str(uuid.uuid4())) is None  # no wait: at once
        assert other.poll() is None  # it was alive all along: refused for being another tenant's
    finally:
        _stop(other)


def _spec(tenant_id: str, volume: Path):  # type: ignore[no-untyped-def]
    from provisioning.drivers.base import Ref, TenantId, TenantSpec

    (volume / ".host").mkdir(parents=True)
    return TenantSpec(tenant_id=TenantId(tenant_id), resource_name="t", operator_slug="op",
                      resources={"volume": Ref(external_id=str(volume), details={"path": str(volume)})})


def test_an_unsandboxed_host_still_inside_execve_is_not_reported_as_exited(fake_host_package: Path, tmp_path: Path,
                                                                            settings) -> None:  # type: ignore[no-untyped-def]
    """The same window without a sandbox (the host is the child itself): only a real exit fails the start at once.

    Before, the first readiness check saw the caller's environment, concluded "exited during start" and failed
    a recovery whose host came up a moment later (the demo on a busy machine ended "Exactly once: NO").
    """
    from controlplane.errors import ProvisioningError
    from provisioning.drivers.local_process import LocalProcessDriver

    settings.RUNTIME_READY_TIMEOUT_S = 2.5
    tenant_id = str(uuid.uuid4())
    env = {"PATH": os.environ.get("PATH", ""), "AGENT_TENANT_ID": tenant_id, "PYTHONPATH": str(fake_host_package)}
    late = (f"import os, sys, time; time.sleep(1.0); "
            f"os.execve(sys.executable, [sys.executable, '-m', {HOST_MODULE!r}], {env!r})")
    proc = subprocess.Popen([sys.executable, "-c", late], cwd=fake_host_package, start_new_session=True)
    try:
        started = time.monotonic()
        # The stand-in never answers /readyz: the start ends at the deadline as "not ready", not as an exit.
        with pytest.raises(ProvisioningError, match="did not become ready in time"):
            LocalProcessDriver()._wait_ready(_spec(tenant_id, tmp_path / "vol"), proc.pid)
        assert time.monotonic() - started >= 2.4
        assert _is_tenant_host(proc.pid, tenant_id)  # it did become the host, under the same pid
    finally:
        _stop(proc)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(10)
    with pytest.raises(ProvisioningError, match="exited during start"):
        LocalProcessDriver()._wait_ready(_spec(tenant_id, tmp_path / "vol2"), gone.pid)


def test_a_host_found_through_its_sandbox_is_recorded_as_itself(fake_host_package: Path, tmp_path: Path) -> None:
    """A worker killed between spawning the sandbox and recording the host leaves the sandbox's pid in the file.
    Whoever finds the host next (a resumed rollout adopts it without ``ensure``) records the host itself, so the
    port it publishes is believed (``published_port`` checks that the recorded pid listens on it); seen as a
    rollout's health gate failing "no http port published yet" after its worker was SIGKILLed under load."""
    from provisioning.drivers.base import Ref, TenantSpec
    from provisioning.drivers.local_process import PID_FILE, live_host_pid

    tenant_id = str(uuid.uuid4())
    volume = tmp_path / "volume"
    (volume / ".host").mkdir(parents=True)
    spec = TenantSpec(tenant_id=tenant_id, resource_name="t_x", operator_slug="op",  # type: ignore[arg-type]
                      resources={"volume": Ref("v", {"path": str(volume)})})
    proc = _spawn(tenant_id, fake_host_package, exec_delay_s=0)
    try:
        (volume / ".host" / PID_FILE).write_text(str(proc.pid))  # what the killed worker had written
        host = live_host_pid(spec)
        assert host is not None and host != proc.pid and psutil.Process(host).ppid() == proc.pid
        assert int((volume / ".host" / PID_FILE).read_text()) == host
        assert live_host_pid(spec) == host  # found directly from now on
    finally:
        _stop(proc)
