"""Issue 17 (demo and run): the demo never serves on a port another program holds.

``choose_port`` is what ``scripts/services.py`` computes its port with; here it meets real listening sockets.
"""

from __future__ import annotations

import importlib.util
import socket
from collections.abc import Iterator

import pytest

from tests.conftest import BASE_DIR


def _services():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("demo_services", BASE_DIR / "scripts" / "services.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@pytest.fixture
def held() -> Iterator[socket.socket]:
    """A port some other program listens on."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    yield sock
    sock.close()


def test_a_taken_default_port_moves_to_a_free_one(held):
    services = _services()
    taken = held.getsockname()[1]
    chosen = services.choose_port(None, first=taken)
    assert chosen != taken and chosen > taken
    for port in (chosen, *(chosen + o for o in services.PEER_OFFSETS)):
        assert services._port_free(port)


def test_a_taken_demo_port_stops_with_one_sentence(held):
    services = _services()
    taken = held.getsockname()[1]
    with pytest.raises(SystemExit) as stopped:
        services.choose_port(str(taken))
    message = str(stopped.value)
    assert message.startswith(f"port {taken} is taken by another program (DEMO_PORT={taken}")
    assert "choose another DEMO_PORT" in message and "\n" not in message


def test_a_peer_port_counts_too():
    services = _services()
    for web in range(20000, 20400, 7):  # a free web port whose SMTP-sink neighbour we can hold
        peer = web + services.PEER_OFFSETS[0]
        if not all(services._port_free(p) for p in (web, *(web + o for o in services.PEER_OFFSETS))):
            continue
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", peer))
            sock.listen()
            with pytest.raises(SystemExit, match=f"port {peer} is taken"):
                services.choose_port(str(web))
        return
    pytest.fail("no free port range to test with")


def test_the_running_stack_keeps_its_port():
    assert _services().choose_port("1", running_on=8123) == 8123
