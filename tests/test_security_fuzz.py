"""Issue 8.1: schemathesis against our own OpenAPI schema, through the real WSGI app, with and without a token.

Every operation in ``/api/schema/`` is fuzzed with generated (valid and invalid) inputs, path ids that
are ours, another operator's and made up: no 5xx, every response matches its documented status code,
content type, headers and body schema, and no response carries a secret planted beforehand (credential
values, tokens, the database password, object keys, the Django secret key, the key ring).
"""

from __future__ import annotations

import base64
import json

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
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from instances.client import forget_tenant
from provisioning.models import AgentInstance
from tenants.actors import SYSTEM
from tests.instance_stub import StubInstance
from tests.test_vault_helpers import make_instance, make_tenant
from vault.choices import DB_PASSWORD_CREDENTIAL
from vault.services import credential_ensure_generated, credential_put, tenant_object_keys

pytestmark = pytest.mark.django_db

# Hypothesis examples per operation and per mode, each sent by both callers (with and without a token).
MAX_EXAMPLES = 25
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance]


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
    planted = {
        "credential A": "plantedA-3f9c2e7b1d4a",
        "credential B": "plantedB-8e1d0c6a5b3f",
        "token A": make_token(operator),
        "token B": make_token(other),
        "instance token A": make_instance(mine),
        "instance token B": make_instance(theirs),
        "db password A": credential_ensure_generated(tenant=mine, name=DB_PASSWORD_CREDENTIAL, actor=SYSTEM),
        "object key A": base64.b64encode(tenant_object_keys(tenant=mine)[0].key).decode(),
        "SECRET_KEY": settings.SECRET_KEY,
        "VAULT_KEK_KEYRING": settings.VAULT_KEK_KEYRING.split(":", 1)[1],
    }
    credential_put(tenant=mine, name="mail", value=planted["credential A"], actor=SYSTEM)
    credential_put(tenant=theirs, name="mail", value=planted["credential B"], actor=SYSTEM)
    # The conversation endpoints reach the customer's instance: here a protocol stub (tests/instance_stub.py).
    stub = StubInstance(str(mine.pk), planted["instance token A"])
    AgentInstance.objects.filter(tenant=mine).update(endpoint=stub.url)
    forget_tenant(str(mine.pk))
    yield {"mine": mine, "theirs": theirs, "token": planted["token A"], "planted": planted}
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


def _fuzz(schema, world) -> tuple[set[int], set[int]]:  # type: ignore[no-untyped-def]
    """Fuzz every operation in both modes; each generated case is sent twice, with the operator token and
    without a token (generating the cases is most of the time, so it is done once for both callers). Returns
    the status codes seen with and without the token (every response is checked)."""
    with_token: set[int] = set()
    without_token: set[int] = set()
    token = world["token"]
    ids = [str(world["mine"].pk), str(world["theirs"].pk), str(world["mine"].pk).upper(), "fuzz-theirs"]
    calls = {True: 0, False: 0}
    checks = [*CHECKS, _no_secret(world["planted"])]
    # Throttling is tested on its own (test_security_abuse); with the token it would only turn cases into 429s.
    # Without a token it stays on, as in production (an anonymous caller is refused before any throttle).
    unthrottled = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {}}
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):

            @hsettings(max_examples=MAX_EXAMPLES, deadline=None, database=None, derandomize=True,
                       suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode), pick=st.integers(0, 5))
            def run(case, pick):  # type: ignore[no-untyped-def]
                if "tenant_id" in (case.path_parameters or {}) and pick < len(ids):
                    case.path_parameters["tenant_id"] = ids[pick]
                if "name" in (case.path_parameters or {}) and pick % 2 == 0:
                    case.path_parameters["name"] = "mail"
                generated = {k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"}
                for authorized in (True, False):
                    headers = {"Authorization": f"Bearer {token}"} if authorized else {}
                    case.headers = {**generated, **headers}
                    if authorized:
                        with override_settings(REST_FRAMEWORK=unthrottled):
                            response = case.call()
                    else:
                        response = case.call()
                    calls[authorized] += 1
                    (with_token if authorized else without_token).add(response.status_code)
                    case.validate_response(response, checks=checks, headers=headers)

            run()
    assert calls[True] >= 9 * MAX_EXAMPLES and calls[False] >= 9 * MAX_EXAMPLES
    return with_token, without_token


def test_every_operation_with_an_operator_token_and_without_a_token(world):
    schema = _schema()
    assert len(list(schema.get_all_operations())) >= 9
    with_token, without_token = _fuzz(schema, world)
    # The token really got in: successes (list, read, onboard, revoke) as well as refusals of bad input.
    assert {200, 202, 400, 404} <= with_token
    # Without: 401, or 400 for a request malformed before authentication (e.g. a NUL byte in a header or the path).
    assert 401 in without_token and without_token <= {400, 401}, without_token


def test_schema_documents_problem_responses_for_every_operation():
    schema = _schema().raw_schema
    assert "Problem" in schema["components"]["schemas"]
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            for code in ("400", "401", "403", "429"):
                content = operation["responses"][code]["content"]
                assert list(content) == ["application/problem+json"], (method, path, code)
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
