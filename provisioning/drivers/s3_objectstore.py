"""Object-store driver for the production profile: one S3 bucket, prefix ``tenants/<tenant-id>/`` per tenant.

Works against any S3-compatible endpoint (AWS, MinIO, Ceph, moto). Per tenant it writes a
prefix marker, and renders a prefix-scoped IAM policy document. With ``S3_ROLE_ARN`` set,
``vend_credentials`` hands out STS AssumeRole credentials narrowed by that document as a
session policy (token vending), so an instance can touch nothing outside its prefix. They
live at most ``S3_CREDENTIALS_DURATION_S`` (1 h by default, AWS's limit for chained role sessions;
``controlplane/s3_session.py`` holds the rule); a running instance renews them itself before expiry through the
internal endpoint ``/internal/v1/s3-credentials/<tenant>``, which vends through here. The
runtime encrypts every object client-side with the tenant key; archives of deprovisioned
tenants and periodic backups go under ``archives/<tenant-id>/``, outside the tenant's own prefix
(``S3Archives``: the production profile's one archive store).

Credentials are never put in ``Ref.details`` (it is stored in plain text): the runtime
driver asks for them when it writes the tenant's Secret.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError
from django.conf import settings

from controlplane.errors import ProvisioningError
from controlplane.s3_session import session_duration_problem

from .archives import ArchiveStore, StoredArchive, archive_key, is_archive
from .base import Observed, Ref, TenantSpec
from .protocols import Capability, ObjectStoreDriver

__all__ = ["S3Archives", "S3ObjectStoreDriver", "bucket_ensure", "s3_client", "s3_bucket", "tenant_policy_document",
           "tenant_prefix", "vend_credentials"]

MARKER = ".tenant"


def tenant_prefix(tenant_id: str) -> str:
    return f"tenants/{tenant_id}/"


def tenant_policy_document(bucket: str, prefix: str) -> dict[str, Any]:
    """IAM policy allowing object reads/writes under ``prefix`` and listing of that prefix only."""
    if not prefix.endswith("/") or prefix.startswith("/") or "*" in prefix:
        raise ValueError(f"refusing policy for prefix {prefix!r}")
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "TenantObjects",
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
                "Resource": [f"arn:aws:s3:::{bucket}/{prefix}*"],
            },
            {
                "Sid": "TenantListing",
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": [f"arn:aws:s3:::{bucket}"],
                "Condition": {"StringLike": {"s3:prefix": [prefix, f"{prefix}*"]}},
            },
        ],
    }


def _client(service: str, endpoint_url: str | None) -> Any:
    kwargs: dict[str, Any] = {
        "region_name": settings.S3_REGION,
        "endpoint_url": endpoint_url,
        "config": Config(retries={"max_attempts": 5, "mode": "standard"}, s3={"addressing_style": "path"}),
    }
    if settings.S3_ACCESS_KEY_ID:
        kwargs["aws_access_key_id"] = settings.S3_ACCESS_KEY_ID
        kwargs["aws_secret_access_key"] = settings.S3_SECRET_ACCESS_KEY
    return boto3.client(service, **kwargs)


def s3_client() -> Any:
    return _client("s3", settings.S3_ENDPOINT_URL)


def s3_bucket() -> str:
    if not settings.S3_BUCKET:
        raise ProvisioningError("S3_BUCKET is not set (required by the kubernetes profile and "
                                "CONTROLPLANE_OBJECTSTORE=s3)")
    return str(settings.S3_BUCKET)



def bucket_ensure(s3: Any, bucket: str) -> None:
    """The bucket reachable, created first when missing and ``S3_CREATE_BUCKET`` allows it."""
    try:
        s3.head_bucket(Bucket=bucket)
    except ClientError as exc:
        if not settings.S3_CREATE_BUCKET:
            raise ProvisioningError(f"bucket {bucket!r} is not reachable: {exc}") from None
        kwargs: dict[str, Any] = {"Bucket": bucket}
        if settings.S3_REGION != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": settings.S3_REGION}
        try:
            s3.create_bucket(**kwargs)
        except ClientError as create_exc:
            if create_exc.response.get("Error", {}).get("Code") not in (
                "BucketAlreadyOwnedByYou", "BucketAlreadyExists"
            ):
                raise


def vend_credentials(spec: TenantSpec) -> dict[str, str]:
    """Temporary credentials for one tenant (AssumeRole + prefix-scoped session policy), as env vars.

    Empty without ``S3_ROLE_ARN``: then the instance gets no S3 credentials from the control plane.
    The duration is checked again here (settings refuse a bad one at start): STS would refuse a
    chained session over 1 h with an error that names neither the setting nor the fix.
    """
    if not settings.S3_ROLE_ARN:
        return {}
    problem = session_duration_problem(
        duration_s=settings.S3_CREDENTIALS_DURATION_S, renew_before_s=settings.S3_CREDENTIALS_RENEW_BEFORE_S,
        not_chained=settings.S3_ROLE_SESSION_NOT_CHAINED,
    )
    if problem:
        raise ProvisioningError(f"refusing to vend S3 credentials for tenant {spec.tenant_id}: {problem}")
    bucket = s3_bucket()
    policy = tenant_policy_document(bucket, tenant_prefix(spec.tenant_id))
    sts = _client("sts", settings.S3_STS_ENDPOINT_URL or settings.S3_ENDPOINT_URL)
    try:
        answer = sts.assume_role(
            RoleArn=settings.S3_ROLE_ARN,
            RoleSessionName=f"tenant-{spec.tenant_id}"[:64],
            Policy=json.dumps(policy, separators=(",", ":")),
            DurationSeconds=settings.S3_CREDENTIALS_DURATION_S,
        )
    except ClientError as exc:
        raise ProvisioningError(f"STS AssumeRole for tenant {spec.tenant_id} failed: {exc}") from None
    creds = answer["Credentials"]
    expiration = creds["Expiration"]
    if isinstance(expiration, datetime):
        expiration = expiration.astimezone(UTC).isoformat()
    return {
        "AWS_ACCESS_KEY_ID": creds["AccessKeyId"],
        "AWS_SECRET_ACCESS_KEY": creds["SecretAccessKey"],
        "AWS_SESSION_TOKEN": creds["SessionToken"],
        "AWS_CREDENTIAL_EXPIRATION": str(expiration),
    }


class S3Archives:
    """Archives as keys ``archives/<tenant-id>/<name>`` in the tenants' bucket, outside every tenant prefix."""

    def __init__(self) -> None:
        self.bucket, self.client = s3_bucket(), s3_client()

    def put(self, tenant_id: str, name: str, blob: bytes) -> str:
        key = archive_key(tenant_id, name)  # one PUT: S3 never shows half an object
        self.client.put_object(Bucket=self.bucket, Key=key, Body=blob, Metadata={"tenant-id": tenant_id})
        return f"s3://{self.bucket}/{key}"

    def get(self, tenant_id: str, name: str) -> bytes:
        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=archive_key(tenant_id, name))
        except ClientError as exc:
            raise ProvisioningError(f"archive {name!r} of tenant {tenant_id} is not readable: {exc}") from None
        body: bytes = answer["Body"].read()
        return body

    def list(self) -> Iterator[StoredArchive]:
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix="archives/"):
            for item in page.get("Contents", []):  # listed in key order: grouped by tenant
                _, tenant_id, name = ([*item["Key"].split("/", 2), "", ""])[:3]
                if is_archive(tenant_id, name):
                    yield StoredArchive(tenant_id, name, int(item["Size"]), item["LastModified"])

    def delete(self, tenant_id: str, name: str) -> None:
        # S3 answers 204 for a key that is not there. A versioned bucket keeps the old version (docs/vault.md).
        self.client.delete_object(Bucket=self.bucket, Key=archive_key(tenant_id, name))

    def url(self, tenant_id: str, name: str) -> str:
        return f"s3://{self.bucket}/{archive_key(tenant_id, name)}"


class S3ObjectStoreDriver(ObjectStoreDriver):
    name = "s3-prefix"
    capabilities = frozenset({Capability.MEASURE_BYTES})

    def _ref(self, spec: TenantSpec) -> Ref:
        bucket = s3_bucket()
        prefix = tenant_prefix(spec.tenant_id)
        url = f"s3://{bucket}/{prefix}"
        details: dict[str, Any] = {
            "url": url,
            "bucket": bucket,
            "prefix": prefix,
            "region": settings.S3_REGION,
            "endpoint_url": settings.S3_INSTANCE_ENDPOINT_URL or settings.S3_ENDPOINT_URL or "",
            "credentials": "sts" if settings.S3_ROLE_ARN else "none",
            "policy": tenant_policy_document(bucket, prefix),
        }
        return Ref(external_id=url, details=details)

    def ensure(self, spec: TenantSpec) -> Ref:
        ref = self._ref(spec)
        s3 = s3_client()
        bucket = ref.details["bucket"]
        bucket_ensure(s3, bucket)
        # S3 has no directories: a marker object makes the prefix (and its owner) visible.
        s3.put_object(
            Bucket=bucket, Key=ref.details["prefix"] + MARKER, Body=b"",
            Metadata={"tenant-id": str(spec.tenant_id), "operator": spec.operator_slug},
        )
        return ref

    def observe(self, spec: TenantSpec, ref: Ref) -> Observed:
        bucket = ref.details.get("bucket") or s3_bucket()
        key = tenant_prefix(spec.tenant_id) + MARKER
        try:
            head = s3_client().head_object(Bucket=bucket, Key=key)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("404", "NoSuchKey", "NotFound", "NoSuchBucket"):
                return Observed(exists=False, healthy=False, detail=f"s3://{bucket}/{key} is missing")
            return Observed(exists=True, healthy=False, detail=f"S3 answered {code}")
        if head.get("Metadata", {}).get("tenant-id") != str(spec.tenant_id):
            return Observed(exists=True, healthy=False, detail="prefix marker names another tenant")
        return Observed(exists=True, healthy=True)

    def delete(self, spec: TenantSpec, ref: Ref) -> None:
        bucket = ref.details.get("bucket") or s3_bucket()
        s3 = s3_client()
        paginator = s3.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=bucket, Prefix=tenant_prefix(spec.tenant_id)):
            keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
            if keys:
                s3.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})

    def archives(self) -> ArchiveStore:
        return S3Archives()

    def bytes_used(self, spec: TenantSpec) -> int:
        # The listing's sizes (1,000 keys a request): S3 has no per-prefix total; CloudWatch's is per bucket.
        ref = spec.resources.get("objectstore")
        bucket = (ref.details.get("bucket") if ref is not None else None) or s3_bucket()
        total = 0
        for page in s3_client().get_paginator("list_objects_v2").paginate(
                Bucket=bucket, Prefix=tenant_prefix(spec.tenant_id)):
            total += sum(int(item["Size"]) for item in page.get("Contents", []))
        return total
