"""The runtime's signatures against the shared vectors (tests/vectors/), the same files the control plane's
implementations are checked against (tests/test_signature_vectors.py): the webhook effect signs Standard
Webhooks exactly as operator webhooks are signed, and the instance API accepts exactly what the control plane
signs. No Django here: the runtime never imports the control plane."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent_runtime.effects.base import ProviderRejected
from agent_runtime.effects.webhook import WebhookEffect, sign_webhook, verify_webhook, webhook_secret_key
from agent_runtime.host import api_auth

from .conftest import ROOT

VECTORS = ROOT / "tests" / "vectors"
WEBHOOKS = json.loads((VECTORS / "standard_webhooks.json").read_text(encoding="utf-8"))
INSTANCE_API = json.loads((VECTORS / "instance_api.json").read_text(encoding="utf-8"))
WEBHOOK_VECTORS: list[dict[str, Any]] = WEBHOOKS["vectors"]


def _ids(vectors: list[dict[str, Any]]) -> list[str]:
    return [v["name"][:60] for v in vectors]


def _headers(v: dict[str, Any], **change: str) -> dict[str, str]:
    return {"webhook-id": v["id"], "webhook-timestamp": str(v["timestamp"]), "webhook-signature": v["signature"],
            **change}


# --- the webhook effect: Standard Webhooks -----------------------------------------------------------------


@pytest.mark.parametrize("v", WEBHOOK_VECTORS, ids=_ids(WEBHOOK_VECTORS))
def test_sign_webhook_gives_each_vector_exactly(v: dict[str, Any]) -> None:
    assert sign_webhook(v["secret"], v["id"], v["timestamp"], v["body"].encode()) == v["signature"]


@pytest.mark.parametrize("v", WEBHOOK_VECTORS, ids=_ids(WEBHOOK_VECTORS))
def test_verify_webhook_accepts_each_vector_and_refuses_it_changed(v: dict[str, Any]) -> None:
    body, ts = v["body"].encode(), v["timestamp"]
    assert verify_webhook(v["secret"], _headers(v), body, now=ts)
    rotated = f"v1a,{v['signature'][3:]} {v['signature']}"
    assert verify_webhook(v["secret"], _headers(v, **{"webhook-signature": rotated}), body, now=ts)
    assert not verify_webhook(v["secret"], _headers(v), body + b" ", now=ts)
    assert not verify_webhook(v["secret"], _headers(v, **{"webhook-id": v["id"] + "x"}), body, now=ts)
    assert not verify_webhook(v["secret"], _headers(v, **{"webhook-timestamp": str(ts - 1)}), body, now=ts)
    assert not verify_webhook(v["secret"], _headers(v), body, now=ts + 301)
    assert not verify_webhook(v["secret"], _headers(v, **{"webhook-signature": "v2" + v["signature"][2:]}), body,
                              now=ts)


@pytest.mark.parametrize("secret", WEBHOOKS["invalid_secrets"]["secrets"])
def test_a_secret_that_is_not_whsec_base64_is_refused(secret: str) -> None:
    with pytest.raises(ValueError, match="whsec_|empty"):
        webhook_secret_key(secret)


class _Credentials:
    def __init__(self, value: str) -> None:
        self.value = value

    def get(self, name: str) -> _Credentials:
        return self


def test_the_effect_fails_on_a_malformed_secret_without_sending() -> None:
    """Not in doubt (nothing left the process) and not retried: the credential has to be fixed."""
    legacy = next(v["legacy_secret"] for v in WEBHOOK_VECTORS if "legacy_secret" in v)
    effect = WebhookEffect("http://127.0.0.1:9/never", credentials=_Credentials(legacy), secret_credential="hook")
    with pytest.raises(ProviderRejected, match="credential 'hook'.*whsec_"):
        effect.perform("eff-1", {"event": "invoice.paid"})


# --- the instance API ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("r", INSTANCE_API["requests"], ids=_ids(INSTANCE_API["requests"]))
def test_the_instance_accepts_exactly_what_the_control_plane_signs(r: dict[str, Any]) -> None:
    key = api_auth.signing_key(r["instance_token"])
    assert key.hex() == r["key_hex"]
    body = r["body"].encode()
    assert api_auth.canonical(r["method"], r["path_and_query"], r["tenant"], r["expires"], body) == (
        r["canonical"].encode())
    assert api_auth.verify(key, r["tenant"], r["authorization"], r["method"], r["path_and_query"], body, now=r["now"])


@pytest.mark.parametrize("case", INSTANCE_API["refused"]["cases"], ids=[c["name"] for c in
                                                                        INSTANCE_API["refused"]["cases"]])
def test_the_instance_refuses_the_vector_changed(case: dict[str, Any]) -> None:
    seen = {**INSTANCE_API["requests"][0], **case}
    key = api_auth.signing_key(seen["instance_token"])
    tenant = seen.get("instance_tenant", seen["tenant"])
    assert not api_auth.verify(key, tenant, seen["authorization"], seen["method"], seen["path_and_query"],
                               seen["body"].encode(), now=seen["now"])
