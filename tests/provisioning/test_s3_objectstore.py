"""S3 object-store driver and the runtime's S3 store against moto's S3/STS server over HTTP.

Prefix creation, the per-tenant policy document, STS token vending, client-side encryption
(tenant B's key cannot read tenant A's objects, even copied into B's prefix), the runtime store
refusing keys outside its prefix, deletion, and archives outside the tenant prefix.
"""

from __future__ import annotations

import fnmatch
import os
import uuid
from datetime import UTC, datetime

import boto3
import pytest

from agent_runtime.errors import ConfigError, CorruptState, ObjectKeyRefused, SnapshotMissing
from agent_runtime.state.objectstore import EncryptedObjectStore, ObjectStore
from agent_runtime.state.objectstore_s3 import S3ObjectStore, encrypted_s3_store, parse_s3_url
from provisioning.drivers.base import TenantId, TenantSpec
from provisioning.drivers.s3_objectstore import S3ObjectStoreDriver, tenant_policy_document, vend_credentials
from tests.k8s_fixtures import moto_server

ROLE_ARN = "arn:aws:iam::123456789012:role/agent-tenant-objects"


@pytest.fixture(scope="module")
def moto_url():
    with moto_server() as url:
        yield url


@pytest.fixture
def s3(moto_url, settings, monkeypatch):
    # boto3 in this process (the runtime store's default client) reads these; moto accepts any key.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "cp-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "cp-test-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_url)  # what the instance Secret sets
    settings.S3_BUCKET = f"bucket-{uuid.uuid4().hex[:12]}"
    settings.S3_ENDPOINT_URL = moto_url
    settings.S3_REGION = "us-east-1"
    settings.S3_CREATE_BUCKET = True
    settings.S3_ACCESS_KEY_ID = "cp-test"
    settings.S3_SECRET_ACCESS_KEY = "cp-test-secret"
    settings.S3_ROLE_ARN = ROLE_ARN
    settings.S3_STS_ENDPOINT_URL = moto_url
    settings.S3_CREDENTIALS_DURATION_S = 3600
    return boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1",
                        aws_access_key_id="cp-test", aws_secret_access_key="cp-test-secret")


def spec() -> TenantSpec:
    tenant_id = str(uuid.uuid4())
    return TenantSpec(tenant_id=TenantId(tenant_id), resource_name=f"t_{uuid.UUID(tenant_id).hex}",
                      operator_slug="acme")


def keys(client, bucket: str, prefix: str = "") -> list[str]:
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []))


def test_ensure_creates_the_prefix_and_is_idempotent(s3, settings):
    driver, tenant = S3ObjectStoreDriver(), spec()
    ref = driver.ensure(tenant)
    assert ref.external_id == f"s3://{settings.S3_BUCKET}/tenants/{tenant.tenant_id}/"
    assert ref.details["prefix"] == f"tenants/{tenant.tenant_id}/"
    assert ref.details["credentials"] == "sts"
    assert "SecretAccessKey" not in str(ref.details)  # credentials never go into the stored details
    assert keys(s3, settings.S3_BUCKET) == [f"tenants/{tenant.tenant_id}/.tenant"]
    assert driver.ensure(tenant) == ref
    assert keys(s3, settings.S3_BUCKET) == [f"tenants/{tenant.tenant_id}/.tenant"]
    assert driver.observe(tenant, ref).healthy

    s3.delete_object(Bucket=settings.S3_BUCKET, Key=f"tenants/{tenant.tenant_id}/.tenant")
    observed = driver.observe(tenant, ref)
    assert (observed.exists, observed.healthy) == (False, False)
    driver.ensure(tenant)
    assert driver.observe(tenant, ref).healthy


def _allows(policy: dict, action: str, resource: str, list_prefix: str | None = None) -> bool:
    """Enough IAM evaluation for Allow statements with Resource globs and an s3:prefix StringLike."""
    for statement in policy["Statement"]:
        if statement["Effect"] != "Allow" or action not in statement["Action"]:
            continue
        if not any(fnmatch.fnmatchcase(resource, pattern) for pattern in statement["Resource"]):
            continue
        condition = statement.get("Condition", {}).get("StringLike", {}).get("s3:prefix")
        if condition is not None and not any(fnmatch.fnmatchcase(list_prefix or "", c) for c in condition):
            continue
        return True
    return False


def test_policy_document_is_scoped_to_the_tenant_prefix():
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    policy = tenant_policy_document("agent-tenants", f"tenants/{a}/")
    own = f"arn:aws:s3:::agent-tenants/tenants/{a}/checkpoints/1"
    other = f"arn:aws:s3:::agent-tenants/tenants/{b}/checkpoints/1"
    for action in ("s3:GetObject", "s3:PutObject", "s3:DeleteObject"):
        assert _allows(policy, action, own)
        assert not _allows(policy, action, other)
        assert not _allows(policy, action, f"arn:aws:s3:::agent-tenants/archives/{a}/x")
    assert _allows(policy, "s3:ListBucket", "arn:aws:s3:::agent-tenants", f"tenants/{a}/")
    assert not _allows(policy, "s3:ListBucket", "arn:aws:s3:::agent-tenants", f"tenants/{b}/")
    assert not _allows(policy, "s3:ListBucket", "arn:aws:s3:::agent-tenants", "tenants/")
    assert not _allows(policy, "s3:DeleteBucket", "arn:aws:s3:::agent-tenants")
    with pytest.raises(ValueError):
        tenant_policy_document("agent-tenants", "tenants/*")


def test_sts_vends_temporary_credentials_per_tenant(s3, settings, moto_url):
    tenant = spec()
    ref = S3ObjectStoreDriver().ensure(tenant)
    creds = vend_credentials(tenant)
    assert set(creds) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                          "AWS_CREDENTIAL_EXPIRATION"}
    assert creds["AWS_ACCESS_KEY_ID"] != settings.S3_ACCESS_KEY_ID
    assert datetime.fromisoformat(creds["AWS_CREDENTIAL_EXPIRATION"]) > datetime.now(UTC)
    assert vend_credentials(spec())["AWS_ACCESS_KEY_ID"] != creds["AWS_ACCESS_KEY_ID"]

    # The vended credentials are what the instance uses: its S3 store works with them.
    client = boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1",
                          aws_access_key_id=creds["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=creds["AWS_SECRET_ACCESS_KEY"],
                          aws_session_token=creds["AWS_SESSION_TOKEN"])
    store = S3ObjectStore.from_url(ref.details["url"], client=client)
    store.put("hello", b"world")
    assert store.get("hello") == b"world"

    settings.S3_ROLE_ARN = ""
    assert vend_credentials(tenant) == {}


def test_tenant_b_key_cannot_read_tenant_a_objects(s3, settings):
    a, b = spec(), spec()
    ref_a, ref_b = S3ObjectStoreDriver().ensure(a), S3ObjectStoreDriver().ensure(b)
    key_a, key_b = os.urandom(32), os.urandom(32)
    store_a = encrypted_s3_store(ref_a.details["url"], key_a, a.tenant_id)
    plaintext = b"case file: customer 4711 asked for a refund"
    store_a.put("checkpoints/1", plaintext)
    assert store_a.get("checkpoints/1") == plaintext

    raw = s3.get_object(Bucket=settings.S3_BUCKET, Key=f"tenants/{a.tenant_id}/checkpoints/1")["Body"].read()
    assert plaintext not in raw  # a leaked listing or copy of the bucket yields ciphertext only

    # B's key on A's prefix, and A's blob copied into B's prefix: both fail authentication.
    with pytest.raises(CorruptState):
        EncryptedObjectStore(S3ObjectStore.from_url(ref_a.details["url"]), key_b, b.tenant_id).get("checkpoints/1")
    s3.put_object(Bucket=settings.S3_BUCKET, Key=f"tenants/{b.tenant_id}/checkpoints/1", Body=raw)
    with pytest.raises(CorruptState):
        encrypted_s3_store(ref_b.details["url"], key_b, b.tenant_id).get("checkpoints/1")
    # Even with A's key, a blob moved to another tenant's name does not open (AAD binds tenant + key).
    with pytest.raises(CorruptState):
        encrypted_s3_store(ref_b.details["url"], key_a, b.tenant_id).get("checkpoints/1")


def test_runtime_store_stays_inside_its_prefix(s3, settings):
    a, b = spec(), spec()
    ref_a, ref_b = S3ObjectStoreDriver().ensure(a), S3ObjectStoreDriver().ensure(b)
    store_a = S3ObjectStore.from_url(ref_a.details["url"])
    store_b = S3ObjectStore.from_url(ref_b.details["url"])
    assert isinstance(store_a, ObjectStore)
    store_b.put("secret", b"b's")
    for bad in ("../" + b.tenant_id + "/secret", "/abs", "a/../../x", "", "a//b", "a\\b", "./x"):
        with pytest.raises(ObjectKeyRefused):
            store_a.put(bad, b"x")
        with pytest.raises(ObjectKeyRefused):
            store_a.get(bad)
    with pytest.raises(ObjectKeyRefused):
        store_a.list("../")

    store_a.put("snapshots/w1.tar", b"1")
    store_a.put("snapshots/w2.tar", b"2")
    store_a.put("index/backup", b"3")
    assert store_a.list() == ["index/backup", "snapshots/w1.tar", "snapshots/w2.tar"]
    assert store_a.list("snapshots/") == ["snapshots/w1.tar", "snapshots/w2.tar"]
    assert store_a.exists("index/backup") and not store_a.exists("secret")
    with pytest.raises(SnapshotMissing):
        store_a.get("secret")
    store_a.delete("index/backup")
    assert not store_a.exists("index/backup")
    assert store_b.get("secret") == b"b's"

    for url in ("s3://bucket/", f"s3://bucket/tenants/{a.tenant_id}", "s3://bucket/tenants/not-a-uuid/",
                f"s3://bucket/tenants/{a.tenant_id}/extra/", f"file:///tenants/{a.tenant_id}/"):
        with pytest.raises(ConfigError):
            parse_s3_url(url)


def test_delete_empties_only_the_tenant_prefix_and_archives_live_outside_it(s3, settings):
    a, b = spec(), spec()
    driver = S3ObjectStoreDriver()
    ref_a, ref_b = driver.ensure(a), driver.ensure(b)
    for i in range(3):
        S3ObjectStore.from_url(ref_a.details["url"]).put(f"obj/{i}", b"x")
    S3ObjectStore.from_url(ref_b.details["url"]).put("keep", b"y")
    archives = driver.archives()
    url = archives.put(a.tenant_id, "schema-1.sql.gz.enc", b"sealed")
    assert url == f"s3://{settings.S3_BUCKET}/archives/{a.tenant_id}/schema-1.sql.gz.enc"
    assert archives.get(a.tenant_id, "schema-1.sql.gz.enc") == b"sealed"
    with pytest.raises(Exception, match="refused"):
        archives.put(a.tenant_id, "../escape", b"x")
    with pytest.raises(Exception, match="not readable"):
        archives.get(b.tenant_id, "schema-1.sql.gz.enc")

    driver.delete(a, ref_a)
    driver.delete(a, ref_a)  # already empty: not an error
    assert keys(s3, settings.S3_BUCKET, f"tenants/{a.tenant_id}/") == []
    assert keys(s3, settings.S3_BUCKET, f"tenants/{b.tenant_id}/") == [
        f"tenants/{b.tenant_id}/.tenant", f"tenants/{b.tenant_id}/keep"
    ]
    assert keys(s3, settings.S3_BUCKET, "archives/") == [f"archives/{a.tenant_id}/schema-1.sql.gz.enc"]
    assert not driver.observe(a, ref_a).exists


def test_journal_records_append_on_s3_and_read_back_as_the_last_entry(s3, settings):
    """S3 cannot append in place: each append puts the object whole with the new record (one PUT, no GET first);
    readers use the last record, and an entry written whole by an older journal reads as one record."""
    a = spec()
    ref = S3ObjectStoreDriver().ensure(a)
    store = encrypted_s3_store(ref.details["url"], os.urandom(32), a.tenant_id)
    store.put("ledger/eff-1", b"older whole entry")
    assert store.records("ledger/eff-1") == [b"older whole entry"]
    store.append("ledger/eff-1", b"intent")
    store.append("ledger/eff-1", b"committed")
    store.append("ledger/eff-2", b"intent")
    assert store.records("ledger/eff-1")[-1] == b"committed"
    assert store.records("ledger/eff-2") == [b"intent"]
    raw = s3.get_object(Bucket=settings.S3_BUCKET, Key=f"tenants/{a.tenant_id}/ledger/eff-1")["Body"].read()
    assert raw.startswith(b"ARL1") and b"committed" not in raw  # each record sealed
    with pytest.raises(SnapshotMissing):
        store.records("ledger/eff-3")


def test_journal_create_on_s3_is_a_conditional_put_that_never_replaces(s3, settings):
    """A new intent's object is created with `If-None-Match: *` (issue 39): S3 refuses it when the key exists,
    so a racing writer never replaces another's entries."""
    a = spec()
    ref = S3ObjectStoreDriver().ensure(a)
    store = encrypted_s3_store(ref.details["url"], os.urandom(32), a.tenant_id)
    assert store.create("ledger/eff-9", b"intent") is True
    assert store.create("ledger/eff-9", b"another intent") is False
    store.append("ledger/eff-9", b"committed")
    assert store.create("ledger/eff-9", b"late intent") is False
    assert store.records("ledger/eff-9") == [b"committed"]  # S3 appends by putting the object whole


def test_a_lost_insert_on_s3_holds_only_until_another_writer_puts_the_object(s3, settings):
    """On S3 a write replaces the object whole, so no history says a racer wrote after the lost attempt's intent:
    the lost INSERT's record (an object of its own) answers only while the last record is that attempt's intent."""
    from agent_runtime.effects.journal import INSERT_LOST, EffectJournal
    from tests.runtime.test_lost_intent_insert import journal_entry

    a = spec()
    ref = S3ObjectStoreDriver().ensure(a)
    journal = EffectJournal(encrypted_s3_store(ref.details["url"], os.urandom(32), a.tenant_id))
    assert journal.create(journal_entry("intent", 100.0))
    journal.insert_lost(journal_entry("intent", 100.0))
    got = journal.get("eff-1")
    assert got is not None and (got.resolution, got.revision) == (INSERT_LOST, 2)
    journal.put(journal_entry("intent", 101.5))  # a racer's intent: the object is now theirs alone
    got = journal.get("eff-1")
    assert got is not None and (got.resolution, got.attempted_at) == (None, 101.5)
    assert keys(s3, settings.S3_BUCKET, f"tenants/{a.tenant_id}/ledger-unreached/") == [
        f"tenants/{a.tenant_id}/ledger-unreached/eff-1"]
