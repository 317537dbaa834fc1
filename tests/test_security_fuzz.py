"""Issues 8.1 and 37: schemathesis against our own OpenAPI schema, through the real WSGI app, with every check.

Every operation in ``/api/schema/`` is fuzzed with generated (valid and invalid) inputs, path ids that are ours,
another operator's and made up, each case sent with the operator token, with a customer token where the operation
accepts one, and without a token. Every built-in check runs (``checks=None``: what ``--checks all`` runs, as
``schemathesis.toml`` configures it): no 5xx, every response matches its documented status code, content type,
headers and body schema, schema-valid input is accepted and schema-invalid input refused, a token-protected
operation refuses the request without its token, and no response carries a secret planted beforehand (credential
values, tokens, the database password, object keys, the Django secret key, the key ring).
"""

from __future__ import annotations

import base64
import json
import os
from contextlib import nullcontext

import pytest
import schemathesis
from django.conf import settings
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.test import override_settings
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

import tests.schemathesis_hooks  # noqa: F401  (registers the Idempotency-Key hook, as schemathesis.toml does)
from conversations.choices import CUSTOMER_TOKEN_SCOPES
from conversations.tokens import customer_token_issue
from instances.client import forget_tenant
from provisioning.models import AgentInstance
from tenants.actors import SYSTEM
from tests.instance_stub import StubInstance
from tests.vault.test_vault_helpers import make_instance, make_tenant
from vault.choices import DB_PASSWORD_CREDENTIAL
from vault.services import credential_ensure_generated, credential_put, tenant_object_keys

pytestmark = pytest.mark.django_db

# Hypothesis examples per operation and per mode, each sent by every caller that applies. Every check on every
# response makes each example dearer than the five checks did: 8 keeps the test near 2 minutes on a loaded
# 2-core machine (docs/security.md, "Fuzzing depth"); FUZZ_MAX_EXAMPLES raises it for a deeper local run.
MAX_EXAMPLES = int(os.environ.get("FUZZ_MAX_EXAMPLES", "8"))


class _InTransactionWSGI:
    """Django's WSGI handler without the per-request connection close, so requests run inside the test's
    transaction (what ``django.test.Client`` does); everything else is the production request path."""

    def __init__(self) -> None:
        self.handler = WSGIHandler()

    def __call__(self, environ, start_response):  # type: ignore[no-untyped-def]
        request_started.disconnect(close_old_connections)
        request_finished.disconnect(close_old_connections)
        try:
            return list(self.handler(environ, start_response))
        finally:
            request_started.connect(close_old_connections)
            request_finished.connect(close_old_connections)


@pytest.fixture
def world(operator, make_token):  # type: ignore[no-untyped-def]
    from tenants.services import operator_create

    other = operator_create(slug="fuzz-other", name="Other", actor=SYSTEM)
    mine, theirs = make_tenant(operator, "fuzz-mine"), make_tenant(other, "fuzz-theirs")
    # The customer token's own tenant: one the operator-token cases never name, so suspending or deleting
    # fuzz-mine does not turn every later customer case into a 401 for a tenant that is gone.
    customer = make_tenant(operator, "fuzz-customer")
    planted = {
        "credential A": "plantedA-3f9c2e7b1d4a",
        "credential B": "plantedB-8e1d0c6a5b3f",
        "token A": make_token(operator),
        "token B": make_token(other),
        "customer token C": customer_token_issue(tenant=customer, scopes=list(CUSTOMER_TOKEN_SCOPES), actor=SYSTEM,
                                                 ttl_s=3600).plaintext,
        "instance token A": make_instance(mine),
        "instance token C": make_instance(customer),
        "instance token B": make_instance(theirs),
        "db password A": credential_ensure_generated(tenant=mine, name=DB_PASSWORD_CREDENTIAL, actor=SYSTEM),
        "object key A": base64.b64encode(tenant_object_keys(tenant=mine)[0].key).decode(),
        "SECRET_KEY": settings.SECRET_KEY,
        "VAULT_KEK_KEYRING": settings.VAULT_KEK_KEYRING.split(":", 1)[1],
    }
    credential_put(tenant=mine, name="mail", value=planted["credential A"], actor=SYSTEM)
    credential_put(tenant=theirs, name="mail", value=planted["credential B"], actor=SYSTEM)
    # The conversation endpoints reach the customer's instance: here a protocol stub (tests/instance_stub.py).
    stubs = []
    for tenant, instance_token in ((mine, planted["instance token A"]), (customer, planted["instance token C"])):
        stubs.append(StubInstance(str(tenant.pk), instance_token))
        AgentInstance.objects.filter(tenant=tenant).update(endpoint=stubs[-1].url)
        forget_tenant(str(tenant.pk))
    yield {"mine": mine, "theirs": theirs, "customer": customer, "token": planted["token A"],
           "customer_token": planted["customer token C"], "planted": planted}
    for stub in stubs:
        stub.stop()


def _schema():  # type: ignore[no-untyped-def]
    return schemathesis.openapi.from_wsgi("/api/schema/", _InTransactionWSGI())


def _no_secret(planted: dict[str, str]):  # type: ignore[no-untyped-def]
    def no_secret_in_response(ctx, response, case):  # type: ignore[no-untyped-def]
        text = response.content.decode("latin-1") + json.dumps(dict(response.headers))
        leaked = [what for what, value in planted.items() if value and value in text]
        assert not leaked, f"{case.method} {case.formatted_path} leaked: {leaked}"
        return True

    return no_secret_in_response


def _callers(operation, world) -> list[str]:  # type: ignore[no-untyped-def]
    """Who sends each case: the operator, the customer where the operation's security names customer tokens,
    and nobody."""
    schemes = {name for requirement in operation.definition.raw.get("security", []) for name in requirement}
    return ["operator", *(["customer"] if "customerToken" in schemes else []), "none"]


def _fuzz(schema, world) -> dict[str, set[int]]:  # type: ignore[no-untyped-def]
    """Fuzz every operation in both modes; each generated case is sent by every caller (generating the cases is
    most of the time, so it is done once for all). Every check runs on every response. Returns the status codes
    each caller saw."""
    seen: dict[str, set[int]] = {"operator": set(), "customer": set(), "none": set()}
    tokens = {"operator": world["token"], "customer": world["customer_token"]}
    ids = {caller: [str(own.pk), str(world["theirs"].pk), str(own.pk).upper(), "fuzz-theirs"]
           for caller, own in (("operator", world["mine"]), ("none", world["mine"]), ("customer", world["customer"]))}
    calls = dict.fromkeys(seen, 0)
    failures: list[str] = []
    no_secret = _no_secret(world["planted"])
    # Throttling is tested on its own (test_security_abuse); with a token it would only turn cases into 429s.
    # Without a token it stays on, as in production (an anonymous caller is refused before any throttle).
    unthrottled = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {}}
    for result in schema.get_all_operations():
        operation = result.ok()
        callers = _callers(operation, world)
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):

            @hsettings(max_examples=MAX_EXAMPLES, deadline=None, database=None, derandomize=True,
                       suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode), pick=st.integers(0, 5))
            def run(case, pick):  # type: ignore[no-untyped-def]
                if "name" in (case.path_parameters or {}) and pick % 2 == 0:
                    case.path_parameters["name"] = "mail"
                generated = {k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"}
                for caller in callers:
                    if "tenant_id" in (case.path_parameters or {}) and pick < len(ids[caller]):
                        case.path_parameters["tenant_id"] = ids[caller][pick]
                    headers = {"Authorization": f"Bearer {tokens[caller]}"} if caller in tokens else {}
                    case.headers = {**generated, **headers}
                    # The checks that send again (ignored_auth) run under the same settings as the case.
                    with override_settings(REST_FRAMEWORK=unthrottled) if headers else nullcontext():
                        response = case.call()
                        calls[caller] += 1
                        seen[caller].add(response.status_code)
                        case.validate_response(response, additional_checks=[no_secret], headers=headers)

            try:
                run()
            except (Exception, BaseExceptionGroup) as failure:  # every operation's failures reported, not the first
                failures.append(f"{operation.label} ({mode.value}): {failure}")
    assert not failures, "\n\n".join(failures)
    assert calls["operator"] >= 9 * MAX_EXAMPLES and calls["none"] >= 9 * MAX_EXAMPLES
    assert calls["customer"] >= 9 * MAX_EXAMPLES
    return seen


def test_every_operation_with_every_check_with_operator_and_customer_tokens_and_without(world):
    schema = _schema()
    assert len(list(schema.get_all_operations())) >= 9
    seen = _fuzz(schema, world)
    # The tokens really got in: successes (list, read, onboard, revoke) as well as refusals of bad input.
    assert {200, 202, 400, 404} <= seen["operator"], seen["operator"]
    assert {200, 400, 404} <= seen["customer"], seen["customer"]
    # Without: 401, or 400 for a request malformed before authentication (e.g. a NUL byte in a header or the path).
    assert 401 in seen["none"] and seen["none"] <= {400, 401}, seen["none"]


def test_schema_documents_problem_responses_for_every_operation():
    schema = _schema().raw_schema
    assert "Problem" in schema["components"]["schemas"]
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            for code in ("400", "401", "403", "429"):
                content = operation["responses"][code]["content"]
                # The MCP endpoint answers a message that is not JSON-RPC with a JSON-RPC error, as MCP clients
                # expect; what is refused before it is read is a problem there too.
                own = {"application/json"} if (path, code) == ("/api/v1/tenants/{tenant_id}/mcp", "400") else set()
                assert set(content) == {"application/problem+json", *own}, (method, path, code)
            assert "Retry-After" in operation["responses"]["429"]["headers"]



def test_the_leak_check_catches_a_planted_value():
    """The no-secret check is only worth something if it fails on a leak: show that it does."""

    class FakeResponse:
        content = b'{"value": "plantedA-3f9c2e7b1d4a"}'
        headers = {"Content-Type": "application/json"}

    class FakeCase:
        method, formatted_path = "GET", "/x"

    check = _no_secret({"credential A": "plantedA-3f9c2e7b1d4a"})
    with pytest.raises(AssertionError, match="credential A"):
        check(None, FakeResponse(), FakeCase())
    FakeResponse.content = b"{}"
    assert check(None, FakeResponse(), FakeCase())
