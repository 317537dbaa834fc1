"""Shared world for the security tests (no tests here): two operators, their customers, every kind of actor.

Operator A and B each have a ready customer with an instance (instance token), a credential and object
keys; A has a full token, a read-only token and a spare token to revoke; B has a full token. Users: staff
with every dashboard permission, staff with none, a superuser, A's portal admin and member, B's portal admin.
A's customer also has a customer token (every customer scope) and a spare one to revoke; both customers'
instances are protocol stubs (tests/instance_stub.py) holding a message, a task and an in-doubt effect of A.
"""

from __future__ import annotations

import copy
import fnmatch
import hashlib
import json
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.cache import caches
from django.core.cache.backends.redis import RedisCache
from django.db import transaction
from django.test import Client

from tests.vault.test_vault_helpers import make_instance, make_tenant

CONTROL_HOST = "testserver"
PORTAL_A_HOST = "portal-a.localhost"
PORTAL_B_HOST = "portal-b.localhost"

ANON, OP_A, OP_A_RO, OP_B = "anonymous", "operator A", "operator A read-only token", "operator B"
STAFF, STAFF_VIEWER, SUPERUSER = "staff", "staff without action permissions", "superuser"
INST_A, INST_B = "instance A", "instance B"
PORTAL_A_ADMIN, PORTAL_A_MEMBER, PORTAL_B_ADMIN = "portal admin of A", "portal member of A", "portal admin of B"
CUST_A = "customer token of A's customer"
ACTORS = (ANON, OP_A, OP_A_RO, OP_B, STAFF, STAFF_VIEWER, SUPERUSER, INST_A, INST_B, PORTAL_A_ADMIN,
          PORTAL_A_MEMBER, PORTAL_B_ADMIN, CUST_A)
PORTAL_USERS = frozenset({PORTAL_A_ADMIN, PORTAL_A_MEMBER, PORTAL_B_ADMIN})
STAFF_ALL = frozenset({STAFF, STAFF_VIEWER, SUPERUSER})

CREDENTIAL_A, CREDENTIAL_B = "cred-value-a-5b0e9d", "cred-value-b-71c2fa"


@dataclass
class World:
    operator_a: Any
    operator_b: Any
    tenant_a: Any
    tenant_b: Any
    tokens: dict[str, str]
    instance_tokens: dict[str, str]
    users: dict[str, Any]
    spare_token_prefix: str
    failed_run_id: str
    asset_sha: str
    extra: dict[str, Any] = field(default_factory=dict)

    def stop(self) -> None:
        for stub in self.extra.get("stubs", []):
            stub.stop()

    def snapshot(self) -> None:
        """Remember the stubs' in-memory state as built, for ``reset`` (see ``shared_world``)."""
        self.extra["stub_states"] = [copy.deepcopy(_stub_state(stub)) for stub in self.extra.get("stubs", [])]

    def reset(self) -> None:
        """Put back what a test's savepoint rollback does not: the stubs' memory, this process's cached
        instance targets, the shared cache's counters of the world's principals, and the in-memory rows.

        After this the world answers exactly as a freshly built one (same ids): a state-changing request of
        an earlier test (a message posted to a stub, an effect decided, a throttle or reset-mail counter
        bumped, a last_login set on a user object) cannot change a later test's answer."""
        from instances.client import forget_tenant
        from provisioning.models import AgentInstance

        for stub, state in zip(self.extra.get("stubs", []), self.extra["stub_states"], strict=True):
            with stub.lock:
                for name, value in copy.deepcopy(state).items():
                    setattr(stub, name, value)
        for tenant in (self.tenant_a, self.tenant_b):
            forget_tenant(str(tenant.pk))
        instances = AgentInstance.objects.filter(tenant__in=[self.tenant_a, self.tenant_b]).values_list("pk", flat=True)
        principals = [f"op:{self.operator_a.pk}", f"op:{self.operator_b.pk}", *(f"inst:{pk}" for pk in instances)]
        _cache_forget([f"throttle:*:{p}:*" for p in principals]
                      + [f"portal:reset-mail:{op.pk}:*" for op in (self.operator_a, self.operator_b)])
        for obj in (self.operator_a, self.operator_b, self.tenant_a, self.tenant_b, *self.users.values()):
            obj.refresh_from_db()

    def client(self, actor: str, *, portal: bool = False, **kwargs: Any) -> Client:
        """A client acting as ``actor``; on portal URLs B's portal users use B's host, everyone else A's."""
        host = (PORTAL_B_HOST if actor == PORTAL_B_ADMIN else PORTAL_A_HOST) if portal else CONTROL_HOST
        client = Client(HTTP_HOST=host, raise_request_exception=False, **kwargs)
        if actor in self.tokens:
            client.defaults["HTTP_AUTHORIZATION"] = f"Bearer {self.tokens[actor]}"
        elif actor in self.instance_tokens:
            client.defaults["HTTP_AUTHORIZATION"] = f"Bearer {self.instance_tokens[actor]}"
        elif actor in self.users:
            client.force_login(self.users[actor])
        return client


_STUB_STATE = ("threads", "tasks", "effects", "posts", "refused_auth", "down", "drop_reply_after", "reply_words")


def _stub_state(stub: Any) -> dict[str, Any]:
    return {name: getattr(stub, name) for name in _STUB_STATE}


def _cache_forget(patterns: list[str]) -> None:
    """Delete the default cache's keys matching the glob ``patterns`` (Redis in the suite; local memory works too)."""
    cache = caches["default"]
    if isinstance(cache, RedisCache):
        client = cache._cache.get_client(write=True)
        for pattern in patterns:
            for key in client.scan_iter(match=cache.make_key(pattern)):
                client.delete(key)
    else:  # LocMemCache: a plain dict of made keys
        store, expiries = getattr(cache, "_cache", {}), getattr(cache, "_expire_info", {})
        for pattern in patterns:
            for key in [k for k in list(store) if fnmatch.fnmatchcase(k, cache.make_key(pattern))]:
                store.pop(key, None)
                expiries.pop(key, None)


@contextmanager
def shared_world(django_db_blocker) -> Iterator[World]:  # type: ignore[no-untyped-def]
    """One world for a whole test module (building it is most of a case's time), never committed.

    It is built inside an outer transaction that is rolled back when the module ends; each test runs in
    pytest-django's own transaction, which is then a savepoint inside it and rolled back after the test,
    so no row a test writes (a suspend, a revoked token, a new customer) is seen by the next test. What a
    rollback cannot undo is put back by ``World.reset`` (call it at the start of every test). Only for
    modules whose tests are all plain ``django_db`` (no ``transaction=True``: a flush inside would fail).
    """
    with django_db_blocker.unblock():
        outer = transaction.atomic()
        outer.__enter__()
        try:
            world = build_world(get_user_model())
        except BaseException:
            transaction.set_rollback(True)
            outer.__exit__(None, None, None)
            raise
        world.snapshot()
        try:
            yield world
        finally:
            world.stop()
            transaction.set_rollback(True)
            outer.__exit__(None, None, None)


def build_world(django_user_model) -> World:  # type: ignore[no-untyped-def]
    from branding.models import BrandingAsset
    from conversations.choices import CUSTOMER_TOKEN_SCOPES
    from conversations.services import message_send, task_submit
    from conversations.tokens import customer_token_issue
    from instances.client import forget_tenant
    from portal.models import OperatorMembership
    from provisioning.models import AgentInstance, WorkflowRun
    from tenants.actors import SYSTEM
    from tenants.services import operator_create
    from tenants.tokens import operator_token_issue
    from tests.instance_stub import StubInstance
    from vault.services import credential_put, tenant_object_keys

    tag = secrets.token_hex(3)
    op_a = operator_create(slug=f"sec-a-{tag}", name="Operator A", actor=SYSTEM, domains=[PORTAL_A_HOST])
    op_b = operator_create(slug=f"sec-b-{tag}", name="Operator B", actor=SYSTEM, domains=[PORTAL_B_HOST])
    tokens = {
        OP_A: operator_token_issue(operator=op_a, actor=SYSTEM).plaintext,
        OP_A_RO: operator_token_issue(operator=op_a, actor=SYSTEM, scopes=["tenants:read"]).plaintext,
        OP_B: operator_token_issue(operator=op_b, actor=SYSTEM).plaintext,
    }
    spare = operator_token_issue(operator=op_a, actor=SYSTEM, name="spare")
    tenant_a, tenant_b = make_tenant(op_a, "cust-a"), make_tenant(op_b, "cust-b")
    instance_tokens = {INST_A: make_instance(tenant_a), INST_B: make_instance(tenant_b)}
    credential_put(tenant=tenant_a, name="mail-a", value=CREDENTIAL_A, actor=SYSTEM)
    credential_put(tenant=tenant_b, name="mail-b", value=CREDENTIAL_B, actor=SYSTEM)
    tenant_object_keys(tenant=tenant_a)
    tenant_object_keys(tenant=tenant_b)
    run = WorkflowRun.objects.create(tenant=tenant_a, kind="onboard", status="failed", error="boom")
    logo = b"\x89PNG\r\n\x1a\n" + secrets.token_bytes(16)
    asset = BrandingAsset.objects.create(sha256=hashlib.sha256(logo).hexdigest(), content_type="image/png",
                                         data=logo, size=len(logo))

    def user(name: str, **flags: Any):  # type: ignore[no-untyped-def]
        u = django_user_model.objects.create_user(f"{name}-{tag}", **flags)
        u.set_unusable_password()
        u.save()
        return u

    users = {
        STAFF: user("staff", is_staff=True),
        STAFF_VIEWER: user("viewer", is_staff=True),
        SUPERUSER: user("root", is_staff=True, is_superuser=True),
        PORTAL_A_ADMIN: user("pa-admin"),
        PORTAL_A_MEMBER: user("pa-member"),
        PORTAL_B_ADMIN: user("pb-admin"),
    }
    users[STAFF].user_permissions.set(Permission.objects.filter(content_type__app_label="dashboard"))
    OperatorMembership.objects.create(user=users[PORTAL_A_ADMIN], operator=op_a, role="admin")
    OperatorMembership.objects.create(user=users[PORTAL_A_MEMBER], operator=op_a, role="member")
    OperatorMembership.objects.create(user=users[PORTAL_B_ADMIN], operator=op_b, role="admin")
    stubs = {}
    for tenant, actor in ((tenant_a, INST_A), (tenant_b, INST_B)):
        stubs[actor] = StubInstance(str(tenant.pk), instance_tokens[actor])
        AgentInstance.objects.filter(tenant=tenant).update(endpoint=stubs[actor].url)
        forget_tenant(str(tenant.pk))
    tokens[CUST_A] = customer_token_issue(tenant=tenant_a, scopes=list(CUSTOMER_TOKEN_SCOPES), actor=SYSTEM).plaintext
    spare_ctk = customer_token_issue(tenant=tenant_a, scopes=["conversations:read"], actor=SYSTEM)
    message = message_send(tenant=tenant_a, thread="main", content="hello", idempotency_key=None, actor=SYSTEM)
    task = task_submit(tenant=tenant_a, kind="demo", params={}, idempotency_key=None, actor=SYSTEM)
    paying = task_submit(tenant=tenant_a, kind="demo", params={"pay": 1}, idempotency_key=None, actor=SYSTEM)
    effect = stubs[INST_A].add_effect(str(paying.item.pk))
    extra = {"stubs": list(stubs.values()), "message_id": str(message.item.pk), "task_id": str(task.item.pk),
             "effect_key": effect, "ctk_spare": spare_ctk.token.prefix}
    return World(operator_a=op_a, operator_b=op_b, tenant_a=tenant_a, tenant_b=tenant_b, tokens=tokens,
                 instance_tokens=instance_tokens, users=users, spare_token_prefix=spare.token.prefix,
                 failed_run_id=str(run.pk), asset_sha=asset.sha256, extra=extra)


def json_body(data: object) -> dict[str, Any]:
    return {"data": json.dumps(data), "content_type": "application/json"}
