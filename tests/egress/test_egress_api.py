"""Issue 38: the egress allow-list API (``/api/v1/egress-rules``, a tenant's ``egress-decisions``) and the rule
syntax. Operator scoping: another operator's rule, tenant or release is a 404; errors are problem+json."""

from __future__ import annotations

import pytest

from egress.choices import DecisionReason, RequestKind
from egress.models import EgressDecision, EgressRule
from egress.rules import AllowList, rule_parse
from egress.selectors import allow_list_for_tenant
from releases.models import AgentRelease, ReleaseAssignment
from tenants.actors import SYSTEM
from tenants.audit import AuditAction
from tenants.models import AuditLog, Tenant
from tenants.services import operator_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def other(make_token):  # type: ignore[no-untyped-def]
    from rest_framework.test import APIClient

    op = operator_create(slug="egress-other", name="Other", actor=SYSTEM)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {make_token(op)}")
    client.operator = op
    return client


def _release(operator, version: str = "1.0.0") -> AgentRelease:  # type: ignore[no-untyped-def]
    return AgentRelease.objects.create(operator=operator, version=version, distribution="a-agent",
                                       digest="sha256:" + "0" * 64, filename="a.whl", size_bytes=1,
                                       artifact_key="wheels/a.whl", kinds={"a": ""})


def test_rule_syntax():
    assert str(rule_parse("API.OpenAI.com.")) == "api.openai.com"
    assert rule_parse("api.stripe.com:8443").port == 8443
    assert rule_parse("bücher.example").host == "xn--bcher-kva.example"
    allow = AllowList.of([rule_parse("*.stripe.com"), rule_parse("api.openai.com"), rule_parse("smtp.example:587")])
    assert allow.permits("api.stripe.com", 443) and allow.permits("a.b.stripe.com", 80)
    assert not allow.permits("stripe.com", 443)  # a wildcard names what is under it, not itself
    assert not allow.permits("evilstripe.com", 443)
    assert not allow.permits("api.openai.com", 22)  # no port: the web ports only
    assert allow.permits("smtp.example", 587) and not allow.permits("smtp.example", 443)
    for bad in ("*", "*.com", "a*.example.com", "exa mple.com", "host:port", "host:70000", "-bad.example", ""):
        with pytest.raises(ValueError):
            rule_parse(bad)


def test_an_operator_adds_lists_reads_and_deletes_its_rules_audited(api, operator):
    made = api.post("/api/v1/egress-rules", {"host": "api.openai.com", "note": "the model provider"}, format="json")
    assert made.status_code == 201, made.content
    body = made.json()
    assert (body["host"], body["port"], body["tenant"], body["release"]) == ("api.openai.com", None, None, None)
    assert api.get("/api/v1/egress-rules").json()[0]["id"] == body["id"]
    assert api.get(f"/api/v1/egress-rules/{body['id']}").json()["note"] == "the model provider"
    assert api.delete(f"/api/v1/egress-rules/{body['id']}").status_code == 204
    assert not EgressRule.objects.filter(operator=operator).exists()
    actions = list(AuditLog.objects.filter(operator_id=operator.pk, action__startswith="egress_rule")
                   .order_by("id").values_list("action", flat=True))
    assert actions == [AuditAction.EGRESS_RULE_CREATE, AuditAction.EGRESS_RULE_DELETE]


def test_rules_per_tenant_and_per_release_make_the_tenants_allow_list(api, operator):
    tenant = Tenant.objects.create(operator=operator, slug="t", name="T")
    sibling = Tenant.objects.create(operator=operator, slug="s", name="S")
    release = _release(operator)
    ReleaseAssignment.objects.create(tenant=tenant, release=release)
    for body in ({"host": "*.stripe.com"}, {"host": "api.openai.com", "tenant": str(tenant.pk)},
                 {"host": "hooks.slack.com", "port": 443, "release": str(release.pk)},
                 {"host": "sibling.example", "tenant": str(sibling.pk)}):
        assert api.post("/api/v1/egress-rules", body, format="json").status_code == 201
    assert {str(r) for r in allow_list_for_tenant(tenant_id=tenant.pk).rules} == {
        "*.stripe.com", "api.openai.com", "hooks.slack.com:443"}
    assert {str(r) for r in allow_list_for_tenant(tenant_id=sibling.pk).rules} == {"*.stripe.com", "sibling.example"}
    listed = api.get(f"/api/v1/egress-rules?tenant={tenant.pk}").json()
    assert [r["host"] for r in listed] == ["api.openai.com"]
    assert [r["host"] for r in api.get(f"/api/v1/egress-rules?release={release.pk}").json()] == ["hooks.slack.com"]


def test_invalid_duplicate_and_two_scoped_rules_are_problems(api, operator):
    tenant = Tenant.objects.create(operator=operator, slug="t", name="T")
    for body in ({"host": "*.com"}, {"host": "exa mple.com"}, {"host": "a.example", "port": 0},
                 {"host": "a.example:443"}, {"host": "a.example."}, {"host": " a.example"}, {"host": "a.example\n"},
                 {"host": "not_a_host"},
                 {"host": "a.example", "unknown": 1},
                 {"host": "a.example", "tenant": str(tenant.pk), "release": str(_release(operator).pk)}):
        answer = api.post("/api/v1/egress-rules", body, format="json")
        assert answer.status_code == 400, (body, answer.content)
        assert answer["Content-Type"].startswith("application/problem+json")
    assert api.post("/api/v1/egress-rules", {"host": "a.example"}, format="json").status_code == 201
    again = api.post("/api/v1/egress-rules", {"host": "A.example"}, format="json")
    assert again.status_code == 409 and again["Content-Type"].startswith("application/problem+json")


def test_another_operators_rule_tenant_and_release_are_404(api, other, operator):
    theirs = EgressRule.objects.create(operator=other.operator, host="their.example")
    their_tenant = Tenant.objects.create(operator=other.operator, slug="x", name="X")
    their_release = _release(other.operator)
    assert api.get(f"/api/v1/egress-rules/{theirs.pk}").status_code == 404
    assert api.delete(f"/api/v1/egress-rules/{theirs.pk}").status_code == 404
    assert api.get("/api/v1/egress-rules/not-a-uuid").status_code == 404
    assert api.get("/api/v1/egress-rules").json() == []
    assert api.post("/api/v1/egress-rules", {"host": "a.example", "tenant": str(their_tenant.pk)},
                    format="json").status_code == 404
    assert api.post("/api/v1/egress-rules", {"host": "a.example", "release": str(their_release.pk)},
                    format="json").status_code == 404
    assert api.get(f"/api/v1/tenants/{their_tenant.pk}/egress-decisions").status_code == 404
    assert EgressRule.objects.filter(pk=theirs.pk).exists()
    assert not EgressRule.objects.filter(operator=operator).exists()


def test_a_tenants_decision_log_is_listed_newest_first(api, operator):
    tenant = Tenant.objects.create(operator=operator, slug="t", name="T")
    for port in (443, 8443):
        EgressDecision.objects.create(tenant=tenant, allowed=port == 443, kind=RequestKind.CONNECT, host="h.example",
                                      port=port, reason=DecisionReason.ALLOWED if port == 443
                                      else DecisionReason.NOT_LISTED)
    page = api.get(f"/api/v1/tenants/{tenant.pk}/egress-decisions?limit=1").json()
    assert [(r["port"], r["allowed"], r["reason"]) for r in page["results"]] == [(8443, False, "not_listed")]
    assert page["next"]


def test_the_dashboards_tenant_page_shows_the_allow_list_and_the_log(operator):
    from django.contrib.auth.models import User
    from django.test import Client

    tenant = Tenant.objects.create(operator=operator, slug="t", name="T")
    EgressRule.objects.create(operator=operator, host="*.stripe.com")
    EgressRule.objects.create(operator=operator, tenant=tenant, host="api.openai.com", port=443)
    EgressDecision.objects.create(tenant=tenant, allowed=False, reason=DecisionReason.NOT_LISTED,
                                  kind=RequestKind.CONNECT, host="evil.example", port=443)
    staff = Client()
    staff.force_login(User.objects.create_user("staff-egress", password="x" * 20, is_staff=True))
    body = staff.get(f"/dashboard/tenants/{tenant.pk}/").content.decode()
    assert 'data-testid="egress-card"' in body
    assert body.count('data-testid="egress-rule"') == 2 and "api.openai.com:443" in body
    assert "evil.example:443" in body and "not_listed" in body
