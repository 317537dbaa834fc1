"""Internal endpoints for an agent instance. Only its own tenant is addressable; values never cached.

DRF views are CSRF-exempt and only instance-token authentication is configured here, so
neither a session cookie nor an operator token gets in. Not part of the public schema.
"""

from __future__ import annotations

import base64

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.errors import NotFound, ValidationFailed
from controlplane.throttles import InstanceCredentialsThrottle
from provisioning.models import AgentInstance
from provisioning.resources.contributions import connection_delivery, tenant_agent_config
from provisioning.resources.s3_credentials import tenant_s3_credentials_renew
from vault.selectors import credential_deliverable
from vault.services import credential_deliver, tenant_object_keys_deliver

from ..identity import instance_actor, instance_heartbeat_record
from ..signals import heartbeat_received
from .authentication import InstanceTokenAuthentication, IsInstance
from .serializers import HeartbeatInput

_NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}


class InstanceAPIView(APIView):
    authentication_classes = [InstanceTokenAuthentication]
    permission_classes = [IsInstance]
    throttle_classes: list[type] = []

    def instance(self, request: Request) -> AgentInstance:
        return request.user.instance


@extend_schema(exclude=True)
class CredentialDeliveryView(InstanceAPIView):
    throttle_classes = [InstanceCredentialsThrottle]

    def get(self, request: Request, name: str) -> Response:
        instance = self.instance(request)
        delivered = credential_deliver(tenant=instance.tenant, name=name, actor=instance_actor(instance))
        return Response({"name": delivered.name, "version": delivered.version, "value": delivered.value},
                        headers=_NO_STORE)

    def head(self, request: Request, name: str) -> Response:
        """204 when a GET would deliver the credential now, else 404; nothing is delivered, consumed or audited.
        (Without this, Django would answer HEAD with the GET: a delivery, consuming a one-time credential.)"""
        if not credential_deliverable(tenant=self.instance(request).tenant, name=name):
            raise NotFound("credential not found")
        return Response(status=status.HTTP_204_NO_CONTENT, headers=_NO_STORE)


@extend_schema(exclude=True)
class ConnectionDeliveryView(InstanceAPIView):
    """A current access token of the instance's own tenant's connection to ``provider`` (refreshed first when
    near expiry). The path names a provider, never a connection: another tenant's is not addressable. ``?task=``
    names the instance's task asking: an end user's task gets that end user's connection (docs/connections.md). 409
    when the connection needs the customer to connect again, 404 when there is none."""

    throttle_classes = [InstanceCredentialsThrottle]

    def get(self, request: Request, provider: str) -> Response:
        instance, delivery = self.instance(request), connection_delivery()
        if delivery is None:
            raise NotFound("connected accounts are not available here")
        # ``?task=``: the id of the task asking; the control plane looks up the end user it recorded for it.
        body = delivery.deliver(tenant=instance.tenant, provider=provider, actor=instance_actor(instance),
                                task=request.query_params.get("task"))
        return Response(body, headers=_NO_STORE)

    def head(self, request: Request, provider: str) -> Response:
        """204 when a GET would deliver a token now, else 404; nothing is refreshed, delivered or audited: the
        host asks this per heartbeat for the connections its blocked tasks wait for."""
        delivery = connection_delivery()
        if delivery is None or not delivery.deliverable(tenant=self.instance(request).tenant, provider=provider,
                                                        task=request.query_params.get("task")):
            raise NotFound("connection not usable")
        return Response(status=status.HTTP_204_NO_CONTENT, headers=_NO_STORE)


@extend_schema(exclude=True)
class ObjectKeysView(InstanceAPIView):
    """Current object key first, then older versions still needed to read older objects."""

    throttle_classes = [InstanceCredentialsThrottle]

    def get(self, request: Request) -> Response:
        instance = self.instance(request)
        keys = tenant_object_keys_deliver(tenant=instance.tenant, actor=instance_actor(instance))
        body = [{"version": k.version, "status": k.status, "key_b64": base64.b64encode(k.key).decode()}
                for k in keys]
        return Response({"current": body[0], "keys": body}, headers=_NO_STORE)


@extend_schema(exclude=True)
class S3CredentialsView(InstanceAPIView):
    """Fresh STS credentials for the instance's own S3 prefix: its client renews them before they expire.

    The path names the tenant the instance expects; only the token's own tenant is ever answered.
    """

    throttle_classes = [InstanceCredentialsThrottle]

    def get(self, request: Request, tenant_id: str) -> Response:
        instance = self.instance(request)
        vended = tenant_s3_credentials_renew(tenant=instance.tenant, requested_tenant_id=tenant_id,
                                             actor=instance_actor(instance))
        return Response({"access_key_id": vended.access_key_id, "secret_access_key": vended.secret_access_key,
                         "session_token": vended.session_token, "expiration": vended.expiration,
                         "bucket": vended.bucket, "prefix": vended.prefix}, headers=_NO_STORE)


@extend_schema(exclude=True)
class HeartbeatView(InstanceAPIView):
    def post(self, request: Request) -> Response:
        if not isinstance(request.data, dict):
            raise ValidationFailed("the body must be a JSON object")
        body = HeartbeatInput(data=request.data)
        body.is_valid(raise_exception=True)
        instance = self.instance(request)
        progress = dict(body.validated_data)
        instance_heartbeat_record(instance=instance, progress=progress)
        heartbeat_received.send(sender=HeartbeatView, tenant_id=instance.tenant_id, status=progress.get("status"))
        return Response(status=status.HTTP_204_NO_CONTENT)


@extend_schema(exclude=True)
class AgentConfigView(InstanceAPIView):
    """The tenant's effective agent configuration, asked once per task by the runtime, which records the answer
    with the task (a change reaches the next task; a replay keeps what the task started with). Credential
    properties carry names; values come from ``credentials/<name>``. Made by the releases app (a contribution)."""

    def get(self, request: Request) -> Response:
        return Response({"config": tenant_agent_config(self.instance(request).tenant)}, headers=_NO_STORE)
