"""The shared API test base (STYLE.md, after NetBox's ``utilities/testing/api.py``): an operator collection's test
declares its URL, its scopes, how to make one of its objects and what a good and a bad create look like, and inherits
the tests every such collection owes its users:

- no token is a 401 problem, a token without the read scope a 403 problem (the scope named), with the read scope only
  a write is a 403 and writes nothing;
- a list holds the caller's own objects and never another operator's;
- another operator's object is a 404 to read, change or delete, and stays as it was;
- a create is a 201 whose answer reads back the same, audited under the declared action; a bad body is a 400
  problem naming the field, and nothing is written;
- a delete is a 204, then the object is a 404, audited; a change (where declared) is a 200 that reads back.

Each collection keeps its own tests of what is particular to it (its validation, its effects); these are the ones
that are the same everywhere, so no collection can forget one. Used by ``tests/<app>/test_*_api_cases.py``.
"""

from __future__ import annotations

import secrets
from typing import Any, ClassVar

import pytest
from rest_framework.test import APIClient

from tenants.actors import SYSTEM
from tenants.models import AuditLog, Operator
from tenants.services import operator_create
from tenants.tokens import operator_token_issue

__all__ = ["OperatorCollectionCases"]

PROBLEM = "application/problem+json"


def _client(operator: Operator, scopes: list[str] | None = None) -> APIClient:
    client = APIClient()
    token = operator_token_issue(operator=operator, actor=SYSTEM, scopes=scopes).plaintext
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


@pytest.mark.django_db
class OperatorCollectionCases:
    """Inherit and declare; pytest collects the inherited ``test_*`` methods once per subclass."""

    url: ClassVar[str]  # the collection, e.g. "/api/v1/egress-rules"
    read_scope: ClassVar[str]
    write_scope: ClassVar[str]
    audit_create: ClassVar[str | None] = None  # the AuditAction value a create records
    audit_delete: ClassVar[str | None] = None
    can_delete: ClassVar[bool] = True
    update_data: ClassVar[dict[str, Any] | None] = None  # a PATCH body, when the collection's objects change
    invalid_field: ClassVar[str]  # the field the bad body gets wrong; the 400 must name it

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A collection without deletes or changes does not inherit their tests (rather than skipping them)."""
        super().__init_subclass__(**kwargs)
        if not cls.can_delete:
            cls.test_a_delete_is_a_204_then_a_404_and_audited = None  # type: ignore[assignment, method-assign]
        if cls.update_data is None:
            cls.test_a_change_is_a_200_that_reads_back = None  # type: ignore[assignment, method-assign]

    # -- what each collection declares -------------------------------------------------------------------------
    def create_data(self, operator: Operator) -> dict[str, Any]:
        raise NotImplementedError

    def invalid_data(self, operator: Operator) -> dict[str, Any]:
        raise NotImplementedError

    def make(self, operator: Operator) -> str:
        """One object of ``operator``'s, made without the API; its id."""
        raise NotImplementedError

    def count(self, operator: Operator) -> int:
        """How many objects ``operator`` has (reads the model, not the API)."""
        raise NotImplementedError

    def detail(self, object_id: str) -> str:
        return f"{self.url}/{object_id}"

    # -- fixtures --------------------------------------------------------------------------------------------------
    @pytest.fixture
    def mine(self, operator: Operator) -> APIClient:
        return _client(operator)

    @pytest.fixture
    def other_operator(self) -> Operator:
        return operator_create(slug=f"other-{secrets.token_hex(3)}", name="Another Operator", actor=SYSTEM)

    # -- the inherited tests ---------------------------------------------------------------------------------------
    def test_no_token_is_a_401_problem(self, operator: Operator) -> None:
        for response in (APIClient().get(self.url), APIClient().post(self.url, {}, format="json")):
            assert response.status_code == 401, response.content
            assert response["Content-Type"].startswith(PROBLEM)

    def test_without_the_read_scope_a_list_is_a_403_naming_it(self, operator: Operator) -> None:
        other_scope = self.write_scope if self.write_scope != self.read_scope else "events:read"
        response = _client(operator, [other_scope]).get(self.url)
        assert response.status_code == 403, response.content
        assert response["Content-Type"].startswith(PROBLEM)
        assert self.read_scope in response.json()["detail"]

    def test_with_the_read_scope_only_a_create_is_a_403_and_writes_nothing(self, operator: Operator) -> None:
        before = self.count(operator)
        response = _client(operator, [self.read_scope]).post(self.url, self.create_data(operator), format="json")
        assert response.status_code == 403, response.content
        assert self.write_scope in response.json()["detail"]
        assert self.count(operator) == before

    def test_a_list_holds_the_callers_own_objects_only(self, operator: Operator, other_operator: Operator,
                                                       mine: APIClient) -> None:
        own, theirs = self.make(operator), self.make(other_operator)
        response = mine.get(self.url)
        assert response.status_code == 200, response.content
        body = response.json()
        rows = body["results"] if isinstance(body, dict) else body
        ids = {str(row["id"]) for row in rows}
        assert own in ids and theirs not in ids

    def test_another_operators_object_is_a_404_to_read_change_or_delete(self, other_operator: Operator,
                                                                         mine: APIClient) -> None:
        theirs = self.make(other_operator)
        before = self.count(other_operator)
        answers = [mine.get(self.detail(theirs))]
        if self.update_data is not None:
            answers.append(mine.patch(self.detail(theirs), self.update_data, format="json"))
        if self.can_delete:
            answers.append(mine.delete(self.detail(theirs)))
        for response in answers:
            assert response.status_code == 404, response.content
            assert response["Content-Type"].startswith(PROBLEM)
        assert self.count(other_operator) == before
        assert _client(other_operator).get(self.detail(theirs)).status_code == 200

    def test_a_create_is_a_201_that_reads_back_and_is_audited(self, operator: Operator, mine: APIClient) -> None:
        data = self.create_data(operator)
        made = mine.post(self.url, data, format="json")
        assert made.status_code == 201, made.content
        object_id = str(made.json()["id"])
        read = mine.get(self.detail(object_id))
        assert read.status_code == 200 and str(read.json()["id"]) == object_id
        if self.audit_create:
            assert AuditLog.objects.filter(action=self.audit_create, operator=operator).exists()

    def test_a_bad_body_is_a_400_problem_naming_the_field_and_writes_nothing(self, operator: Operator,
                                                                           mine: APIClient) -> None:
        before = self.count(operator)
        response = mine.post(self.url, self.invalid_data(operator), format="json")
        assert response.status_code == 400, response.content
        assert response["Content-Type"].startswith(PROBLEM)
        assert self.invalid_field in response.content.decode(), response.content
        assert self.count(operator) == before

    def test_a_delete_is_a_204_then_a_404_and_audited(self, operator: Operator, mine: APIClient) -> None:
        own = self.make(operator)
        gone = mine.delete(self.detail(own))
        assert gone.status_code == 204, gone.content
        assert mine.get(self.detail(own)).status_code == 404
        if self.audit_delete:
            assert AuditLog.objects.filter(action=self.audit_delete, operator=operator).exists()

    def test_a_change_is_a_200_that_reads_back(self, operator: Operator, mine: APIClient) -> None:
        assert self.update_data is not None
        own = self.make(operator)
        changed = mine.patch(self.detail(own), self.update_data, format="json")
        assert changed.status_code == 200, changed.content
        read = mine.get(self.detail(own)).json()
        for key, value in self.update_data.items():
            assert read[key] == value, (key, read)
