"""Issue 33: a refresh whose answer was lost, against a provider with a documented refresh-token reuse grace (the
example Authlib server with ``reuse_grace_s``, like Okta's grace period). With the OAuth client's
``refresh_reuse_grace_s`` the same refresh token is sent once more inside the grace; without it (the default) the
connection ends ``needs_reauth`` and nothing is resent. Asserted at the provider: what was presented, and that no
reuse was ever detected.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.utils import timezone

from connections import oauth
from connections.choices import ConnectionStatus
from connections.models import Connection
from connections.services import _client_secret, connection_refresh, connection_tokens_read
from tenants.models import AuditLog
from tests.connections.test_connections import connect, register
from tests.oauth_peer import OAuthPeer
from tests.vault.test_vault_helpers import make_tenant

pytestmark = pytest.mark.django_db

GRACE_S = 30


@pytest.fixture
def peer(settings) -> Iterator[OAuthPeer]:  # type: ignore[no-untyped-def]
    settings.OAUTH_ALLOW_HTTP_LOOPBACK = True
    with OAuthPeer(reuse_grace_s=GRACE_S) as running:
        yield running


def connected(api, peer: OAuthPeer, grace_s: int) -> Connection:  # type: ignore[no-untyped-def]
    assert register(api, peer, refresh_reuse_grace_s=grace_s).status_code == 201
    return connect(api, peer, make_tenant(api.operator))


def test_a_lost_answer_is_resent_once_within_the_grace_and_the_connection_stays_valid(api, peer, settings):
    connection = connected(api, peer, GRACE_S)
    first = connection_tokens_read(connection=connection).refresh_token
    settings.OAUTH_HTTP_TIMEOUT_S = 0.5
    peer.token_delays = [1.5]  # the provider rotates, and its first answer never comes back in time
    outcome = connection_refresh(connection_id=connection.pk, ahead_s=120)
    assert outcome.outcome == "refreshed", outcome.connection.status_reason
    assert peer.refresh_presented == [first, first] and peer.grace_reuses == [first]
    assert peer.reuse_detected == [] and peer.revoked_families == set()
    stored = connection_tokens_read(connection=outcome.connection)
    rotation = peer.issued[1]  # the one answer the provider made; the grace repeated it
    assert (stored.access_token, stored.refresh_token) == (rotation["access_token"], rotation["refresh_token"])
    connection.refresh_from_db()
    assert connection.status == ConnectionStatus.ACTIVE
    assert connection.refresh_sent_at is None and connection.refresh_resent_at is None
    assert AuditLog.objects.get(action="connection.refresh", target_id=str(connection.pk)).data["resent"] is True
    # The next refresh sends the new refresh token, once, as usual.
    assert connection_refresh(connection_id=connection.pk, ahead_s=120).outcome == "refreshed"
    assert peer.refresh_presented[2:] == [rotation["refresh_token"]] and peer.reuse_detected == []


def test_at_most_one_resend_per_refresh_token(api, peer, settings):
    connection = connected(api, peer, GRACE_S)
    first = connection_tokens_read(connection=connection).refresh_token
    settings.OAUTH_HTTP_TIMEOUT_S = 0.5
    peer.token_delay_s = 1.5  # every answer lost, the resend's too
    outcome = connection_refresh(connection_id=connection.pk, ahead_s=120)
    assert outcome.outcome == "needs_reauth" and outcome.connection.status_reason == "refresh_interrupted"
    peer.token_delay_s = 0.0
    assert connection_refresh(connection_id=connection.pk, ahead_s=120).outcome == "inactive"
    assert peer.refresh_presented == [first, first] and peer.grace_reuses == [first]
    assert peer.reuse_detected == [] and peer.revoked_families == set()


def test_a_refresher_that_died_after_sending_is_followed_by_one_resend_within_the_grace(api, peer):
    """The marker is committed and the provider rotated (the dead refresher's request, sent here for real), but the
    answer never reached our commit. Inside the grace the next refresher resends once; past it, needs_reauth."""
    connection = connected(api, peer, GRACE_S)
    client = connection.oauth_client

    def die_after_sending(conn: Connection) -> str:
        held = connection_tokens_read(connection=conn).refresh_token
        assert held is not None
        oauth.refresh(endpoint=client.token_endpoint, client_id=client.client_id,
                      client_secret=_client_secret(client), refresh_token=held)  # its answer is lost with it
        return held

    spent = die_after_sending(connection)
    Connection.objects.filter(pk=connection.pk).update(refresh_sent_at=timezone.now() - timedelta(seconds=2))
    outcome = connection_refresh(connection_id=connection.pk, ahead_s=120)
    assert outcome.outcome == "refreshed"
    assert connection_tokens_read(connection=outcome.connection).refresh_token == peer.issued[-1]["refresh_token"]
    assert peer.grace_reuses == [spent] and peer.reuse_detected == []

    # Past the grace (counted from our send, which is before the provider's rotation): no resend.
    other = connect(api, peer, make_tenant(api.operator))
    spent_too = die_after_sending(other)
    Connection.objects.filter(pk=other.pk).update(refresh_sent_at=timezone.now() - timedelta(seconds=GRACE_S + 1))
    presented = len(peer.refresh_presented)
    late = connection_refresh(connection_id=other.pk, ahead_s=120)
    assert late.outcome == "needs_reauth" and late.connection.status_reason == "refresh_interrupted"
    assert len(peer.refresh_presented) == presented and spent_too not in peer.grace_reuses
    assert peer.reuse_detected == [] and peer.revoked_families == set()


def test_without_a_grace_a_lost_answer_ends_needs_reauth_and_nothing_is_resent(api, peer, settings):
    connection = connected(api, peer, 0)  # the default: the provider documents no grace
    first = connection_tokens_read(connection=connection).refresh_token
    settings.OAUTH_HTTP_TIMEOUT_S = 0.5
    peer.token_delays = [1.5]
    outcome = connection_refresh(connection_id=connection.pk, ahead_s=120)
    assert outcome.outcome == "needs_reauth" and outcome.connection.status_reason == "refresh_interrupted"
    assert peer.refresh_presented == [first] and peer.grace_reuses == [] and peer.reuse_detected == []
    # A marker found by the next refresher, likewise.
    other = connect(api, peer, make_tenant(api.operator))
    Connection.objects.filter(pk=other.pk).update(refresh_sent_at=timezone.now())
    found = connection_refresh(connection_id=other.pk, ahead_s=120)
    assert found.outcome == "needs_reauth" and peer.refresh_presented == [first]
    shown = api.get(f"/api/v1/oauth-clients/{connection.oauth_client_id}").json()
    assert shown["refresh_reuse_grace_s"] == 0 and shown["end_user_fallback"] is False
