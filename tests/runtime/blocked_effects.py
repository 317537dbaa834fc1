"""A task whose effect is blocked for a human, planted in a tenant schema exactly as the ledger leaves one when
the provider cannot be asked whether it acted (shared by the instance-API and control-plane decision tests)."""

from __future__ import annotations

import base64
import uuid

from agent_runtime.db import connect
from agent_runtime.effects.journal import EffectJournal
from agent_runtime.effects.ledger import EffectLedger, EffectRecord, args_digest, idempotency_key
from agent_runtime.state import tasks as task_store
from agent_runtime.state.migrations import migrate
from agent_runtime.state.objectstore import EncryptedObjectStore, objectstore_from_url

__all__ = ["plant_blocked_email"]


def plant_blocked_email(env: dict[str, str]) -> tuple[str, str]:
    """A 'multi' task (tests.runtime.agents) blocked on its first email; returns (task id, effect key).

    `env` is the instance's environment (AGENT_DATABASE_URL, AGENT_SCHEMA, object store and key, tenant id)."""
    tid = uuid.uuid4()
    store = EncryptedObjectStore(objectstore_from_url(env["AGENT_OBJECTSTORE_URL"]),
                                 base64.b64decode(env["AGENT_OBJECT_KEY"]), env["AGENT_TENANT_ID"])
    with connect(env["AGENT_DATABASE_URL"], env["AGENT_SCHEMA"], autocommit=True) as c:
        migrate(c, env["AGENT_SCHEMA"])
        task_store.submit(c, "multi", {"emails": 1}, task_id=tid)
        args = {"from": "a@t", "to": "user0@t", "subject": f"n0 {tid}", "body": "hi"}
        key = idempotency_key(tid, "notify", "email")
        EffectLedger(c, env["AGENT_TENANT_ID"], EffectJournal(store))._insert(EffectRecord(
            0, tid, "notify", "email", key, args, args_digest(args), "blocked", None, "no_provider_lookup", 0, None))
        task_store.set_status(c, tid, "blocked", "effect_in_doubt", "a human must decide")
    return str(tid), key
