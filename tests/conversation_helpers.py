"""Helpers for the conversation API tests (no tests here): a tenant whose instance is a protocol stub."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.instance_stub import StubInstance
from tests.vault.test_vault_helpers import make_instance, make_tenant


def stub_tenant(operator, **stub_kwargs: Any):  # type: ignore[no-untyped-def]
    """A ready tenant whose instance endpoint is a fresh ``StubInstance`` (returned with it)."""
    from instances.client import forget_tenant
    from provisioning.models import AgentInstance

    tenant = make_tenant(operator)
    token = make_instance(tenant)
    stub = StubInstance(str(tenant.pk), token, **stub_kwargs)
    AgentInstance.objects.filter(tenant=tenant).update(endpoint=stub.url)
    forget_tenant(str(tenant.pk))
    return tenant, stub


def post_json(client, path: str, data: object, **headers: str):  # type: ignore[no-untyped-def]
    return client.post(path, data=json.dumps(data), content_type="application/json",
                       **{f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()})


def sse_events(raw: bytes) -> list[tuple[str, str]]:
    """(event, data) pairs of an SSE body; comments become ("comment", text)."""
    events = []
    for block in raw.decode().split("\n\n"):
        event, data = "message", []
        for line in block.splitlines():
            if line.startswith(":"):
                events.append(("comment", line[1:].strip()))
            elif line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
        if data or event != "message":
            events.append((event, "\n".join(data)))
    return events


# The test `chat` agent holds after its first word while `chat_hold_file` exists. The path is relative: the
# instance resolves it in its working directory, its own volume, the only place of the test's it can see
# from its sandbox (a file under the session's /tmp is not there for it).
CHAT_HOLD_NAME = "chat-hold"


def chat_hold() -> None:
    """Make every instance of this session hold its next reply after the first word."""
    from django.conf import settings

    for volume in Path(settings.LOCAL_VOLUME_ROOT).glob("*/"):
        (volume / CHAT_HOLD_NAME).write_text("hold")


def chat_release() -> None:
    from django.conf import settings

    for hold in Path(settings.LOCAL_VOLUME_ROOT).glob(f"*/{CHAT_HOLD_NAME}"):
        hold.unlink(missing_ok=True)
