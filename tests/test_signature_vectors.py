"""The control plane's signatures against the shared vectors (tests/vectors/): what it sends to operators'
receivers (Standard Webhooks, webhooks.signing) and to instances (the instance API, instances.signing).

The runtime's implementations are checked against the same files in tests/runtime/test_signature_vectors.py;
here, beside ours, the example receiver and the ``standardwebhooks`` package (the spec's reference library)
check the webhook vectors, and the instance stub's own verifier checks the instance API vector.
"""

from __future__ import annotations

import base64
import importlib
import importlib.util
import json
import subprocess
import time
from datetime import UTC, datetime
from types import ModuleType
from typing import Any

import pytest
from standardwebhooks import Webhook

from instances import signing as instance_signing
from tests import instance_stub
from tests.conftest import BASE_DIR
from webhooks import signing

VECTORS = BASE_DIR / "tests" / "vectors"
WEBHOOKS = json.loads((VECTORS / "standard_webhooks.json").read_text(encoding="utf-8"))
INSTANCE_API = json.loads((VECTORS / "instance_api.json").read_text(encoding="utf-8"))
WEBHOOK_VECTORS = WEBHOOKS["vectors"]
INVALID_SECRETS = WEBHOOKS["invalid_secrets"]["secrets"]


def _ids(vectors: list[dict[str, Any]]) -> list[str]:
    return [v["name"][:60] for v in vectors]


def _headers(v: dict[str, Any], **change: str) -> dict[str, str]:
    return {"webhook-id": v["id"], "webhook-timestamp": str(v["timestamp"]), "webhook-signature": v["signature"],
            **change}


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("webhook_receiver", BASE_DIR / "examples" / "webhook_receiver.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXAMPLE = _example()


# --- Standard Webhooks ------------------------------------------------------------------------------------


def test_the_vectors_include_the_specs_published_example():
    published = WEBHOOK_VECTORS[0]
    assert (published["secret"], published["id"], published["timestamp"], published["signature"]) == (
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330,
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")


@pytest.mark.parametrize("v", WEBHOOK_VECTORS, ids=_ids(WEBHOOK_VECTORS))
def test_the_control_plane_signs_each_vector_exactly(v):
    body = v["body"].encode()
    assert signing.sign(v["secret"], v["id"], v["timestamp"], body) == v["signature"]
    assert signing.signed_headers(v["secret"], v["id"], v["timestamp"], body) == _headers(v)


@pytest.mark.parametrize("v", WEBHOOK_VECTORS, ids=_ids(WEBHOOK_VECTORS))
def test_the_control_plane_verifies_each_vector_and_refuses_it_changed(v):
    body, ts = v["body"].encode(), v["timestamp"]
    assert signing.verify(v["secret"], _headers(v), body, now=ts)
    assert signing.verify(v["secret"], _headers(v), body, now=ts + signing.TOLERANCE_S)
    # Several signatures (a secret being rotated, or a scheme we do not know): one valid v1 is enough.
    rotated = f"v1a,{v['signature'][3:]} v1,{base64.b64encode(bytes(32)).decode()} {v['signature']}"
    assert signing.verify(v["secret"], _headers(v, **{"webhook-signature": rotated}), body, now=ts)
    assert signing.verify(v["secret"], {k.title(): val for k, val in _headers(v).items()}, body, now=ts)
    other_secret = signing.new_secret()
    refused = [
        (v["secret"], _headers(v), body + b" ", ts),
        (v["secret"], _headers(v, **{"webhook-id": v["id"] + "x"}), body, ts),
        (v["secret"], _headers(v, **{"webhook-timestamp": str(ts + 1)}), body, ts),
        (v["secret"], _headers(v), body, ts + signing.TOLERANCE_S + 1),  # a captured request, replayed later
        (v["secret"], _headers(v), body, ts - signing.TOLERANCE_S - 1),  # from the future
        (v["secret"], _headers(v, **{"webhook-signature": "v2" + v["signature"][2:]}), body, ts),
        (v["secret"], _headers(v, **{"webhook-signature": ""}), body, ts),
        (v["secret"], _headers(v, **{"webhook-timestamp": "１７"}), body, ts),
        (other_secret, _headers(v), body, ts),
    ]
    for secret, headers, data, now in refused:
        assert not signing.verify(secret, headers, data, now=now), headers


@pytest.mark.parametrize("secret", INVALID_SECRETS)
def test_the_control_plane_refuses_a_secret_that_is_not_whsec_base64(secret):
    with pytest.raises(ValueError, match="whsec_|empty"):
        signing.sign(secret, "evt_1", 1700000000, b"{}")


@pytest.mark.parametrize("v", WEBHOOK_VECTORS, ids=_ids(WEBHOOK_VECTORS))
def test_the_reference_library_agrees_with_each_vector(v):
    stamp = datetime.fromtimestamp(v["timestamp"], tz=UTC)
    assert Webhook(v["secret"]).sign(v["id"], stamp, v["body"]) == v["signature"]


def test_the_reference_library_verifies_what_the_control_plane_signs_now():
    secret, body, now = signing.new_secret(), b'{"id":"evt_1","type":"webhook.test"}', int(time.time())
    headers = signing.signed_headers(secret, "evt_1", now, body)
    assert Webhook(secret).verify(body, headers) == {"id": "evt_1", "type": "webhook.test"}
    assert Webhook(secret.removeprefix("whsec_")).verify(body, headers)  # the prefix is optional to it


@pytest.mark.parametrize("v", WEBHOOK_VECTORS, ids=_ids(WEBHOOK_VECTORS))
def test_the_example_receiver_verifies_each_vector(v):
    key, body, ts = EXAMPLE.secret_key(v["secret"]), v["body"].encode(), v["timestamp"]
    assert EXAMPLE.verify_signature(key, _headers(v), body, now=ts, tolerance_s=300)
    assert not EXAMPLE.verify_signature(key, _headers(v), body + b" ", now=ts, tolerance_s=300)
    assert not EXAMPLE.verify_signature(key, _headers(v, **{"webhook-id": "msg_x"}), body, now=ts, tolerance_s=300)
    assert not EXAMPLE.verify_signature(key, _headers(v), body, now=ts + 301, tolerance_s=300)


@pytest.mark.parametrize("secret", INVALID_SECRETS)
def test_the_example_receiver_refuses_a_secret_that_is_not_whsec_base64(secret):
    with pytest.raises(ValueError, match="whsec_"):
        EXAMPLE.secret_key(secret)


def test_an_old_endpoint_secret_keeps_its_key_once_converted():
    """The data migration's rule (webhooks/migrations/0003): whsec_ + base64(old secret), and back."""
    migration = importlib.import_module("webhooks.migrations.0003_standard_webhooks_secrets")
    (v,) = [v for v in WEBHOOK_VECTORS if "legacy_secret" in v]
    assert migration._to_standard(v["legacy_secret"]) == v["secret"]
    assert migration._to_legacy(v["secret"]) == v["legacy_secret"]
    assert signing.secret_key(v["secret"]) == v["legacy_secret"].encode()  # the HMAC key it always had
    new = signing.new_secret()
    assert migration._to_standard(new) is None and migration._to_legacy(new) is None  # never converted twice


def test_the_conversion_docs_webhooks_md_gives_operators_is_the_migrations():
    (v,) = [v for v in WEBHOOK_VECTORS if "legacy_secret" in v]
    page = (BASE_DIR / "docs" / "webhooks.md").read_text(encoding="utf-8")
    (command,) = [line.strip() for line in page.splitlines() if "b64encode(sys.argv[1]" in line]
    out = subprocess.run(["bash", "-c", command], env={"OLD_SECRET": v["legacy_secret"], "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, check=True, timeout=30).stdout
    assert out.strip() == v["secret"]


# --- the instance API ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("r", INSTANCE_API["requests"], ids=_ids(INSTANCE_API["requests"]))
def test_the_control_plane_signs_each_instance_api_request_exactly(r):
    body = r["body"].encode()
    key = instance_signing.signing_key(r["instance_token"])
    assert key.hex() == r["key_hex"]
    assert instance_signing.canonical_string(r["method"], r["path_and_query"], r["tenant"], r["expires"],
                                             body) == r["canonical"].encode()
    assert instance_signing.sign(r["instance_token"], r["tenant"], r["method"], r["path_and_query"], body,
                                 now=r["now"]) == r["authorization"]
    assert instance_signing.sign(key, r["tenant"], r["method"], r["path_and_query"], body,
                                 now=r["now"]) == r["authorization"]


def test_the_instance_stub_accepts_the_vector_and_refuses_each_change():
    r = INSTANCE_API["requests"][0]
    assert instance_stub.verify(r["instance_token"], r["tenant"], r["authorization"], r["method"],
                                r["path_and_query"], r["body"].encode(), r["now"])
    for case in INSTANCE_API["refused"]["cases"]:
        seen = {**r, **case}
        assert not instance_stub.verify(seen.get("instance_token"), seen.get("instance_tenant", r["tenant"]),
                                        seen["authorization"], seen["method"], seen["path_and_query"],
                                        seen["body"].encode(), seen["now"]), case["name"]
