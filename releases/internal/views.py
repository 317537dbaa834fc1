"""What an instance asks the releases app for over the internal API: its tenant's effective agent configuration.

Same door as credentials (``instances.internal``): instance-token authentication only, the token's own tenant only,
never cached. Credential properties carry names; the instance asks ``/internal/v1/credentials/<name>`` for values.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from instances.internal.views import InstanceAPIView

from ..agent_configs import tenant_agent_config_get

_NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}


@extend_schema(exclude=True)
class AgentConfigDeliveryView(InstanceAPIView):
    """Asked once per task by the runtime (``agent_runtime.host.agent_config``), which records the answer with
    the task: a change reaches the next task without a restart, a replayed task keeps what it started with."""

    def get(self, request: Request) -> Response:
        view = tenant_agent_config_get(tenant=self.instance(request).tenant)
        return Response({"config": view.effective,
                         "release": str(view.release.pk) if view.release is not None else None,
                         "credential_fields": view.credential_fields}, headers=_NO_STORE)
