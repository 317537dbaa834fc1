"""``/api/v1/releases``: upload (validate, then register) and read an operator's agent releases."""

from __future__ import annotations

import json

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.errors import ValidationFailed
from controlplane.parsers import SafeJSONParser
from provisioning.fleet.actions import RESTARTABLE
from tenants.api.serializers import NoInput
from tenants.api.views import ScopedView
from tenants.choices import TokenScope
from tenants.models import Tenant
from tenants.selectors import tenant_get

from ..agent_configs import tenant_agent_config_get, tenant_agent_config_set
from ..assignments import booted_release, release_default_set, tenant_release_pin, tenant_release_seen
from ..models import DefaultRelease
from ..rollouts import rollout_abort, rollout_create, rollout_pause, rollout_resume, rollout_rollback
from ..selectors import release_get, release_list, rollout_get, rollout_list
from ..services import release_create, release_create_image
from .serializers import (
    AgentConfigInput,
    AgentConfigOutput,
    DefaultReleaseInput,
    DefaultReleaseOutput,
    ReleaseImageInput,
    ReleaseOutput,
    ReleaseUploadInput,
    RolloutCreateInput,
    RolloutDetailOutput,
    RolloutOutput,
    TenantReleaseInput,
    TenantReleaseOutput,
)


class ReleaseListCreateView(ScopedView):
    scopes = {"GET": TokenScope.RELEASES_READ, "POST": TokenScope.RELEASES_WRITE}
    # Multipart: a wheel (local profile); JSON: a container image (Kubernetes profile).
    parser_classes = [MultiPartParser, SafeJSONParser]

    @extend_schema(operation_id="releases_list", tags=["releases"], responses=ReleaseOutput(many=True),
                   description="Your agent releases, newest first.")
    def get(self, request: Request) -> Response:
        return Response(ReleaseOutput(release_list(operator=self.operator(request)), many=True).data)

    @extend_schema(operation_id="releases_create", tags=["releases"],
                   request={"multipart/form-data": ReleaseUploadInput, "application/json": ReleaseImageInput},
                   responses={201: ReleaseOutput},
                   description="Register a new version of your agent. Local profile: upload it as a wheel "
                               "(multipart). It is registered only once it has passed validation: the digest "
                               "matches, it is a wheel, every dependency is one the runtime has, it installs and "
                               "imports in a sandbox, and it provides at least one agent kind. 413 past "
                               "RELEASE_MAX_WHEEL_BYTES. Kubernetes profile: send a JSON body naming a container "
                               "image pinned by digest (`registry/repository@sha256:<64 hex>`; a tag alone is "
                               "refused), its version and the agent kinds it provides. Otherwise 400 naming the "
                               "cause, and nothing is kept. A version is registered once (409). The kind of "
                               "release the other profile takes is a 409 `release-artifact-unsupported`.")
    def post(self, request: Request) -> Response:
        if not (request.content_type or "").lower().startswith("multipart/"):
            image = self.body(request, ReleaseImageInput)
            release = release_create_image(operator=self.operator(request), actor=self.actor(request), **image)
            return Response(ReleaseOutput(release).data, status=status.HTTP_201_CREATED)
        body = self.body(request, ReleaseUploadInput)
        try:
            config = json.loads(body.get("default_config") or "{}")
        except ValueError:
            raise ValidationFailed("default_config must be a JSON object") from None
        upload = body["file"]
        release = release_create(operator=self.operator(request), filename=upload.name, data=upload.read(),
                                 sha256=body.get("sha256") or None, notes=body.get("notes", ""),
                                 default_config=config, actor=self.actor(request))
        return Response(ReleaseOutput(release).data, status=status.HTTP_201_CREATED)


class ReleaseDetailView(ScopedView):
    scopes = {"GET": TokenScope.RELEASES_READ}

    @extend_schema(operation_id="releases_retrieve", tags=["releases"], responses=ReleaseOutput,
                   description="One release: its version, digest and the agent kinds it provides.")
    def get(self, request: Request, release_id: str) -> Response:
        return Response(ReleaseOutput(release_get(operator=self.operator(request), release_id=release_id)).data)


_NO_SUCH_RELEASE = OpenApiResponse(description="The body names no release of yours (another operator's release is "
                                               "indistinguishable from a missing one).")


class DefaultReleaseView(ScopedView):
    scopes = {"GET": TokenScope.RELEASES_READ, "PUT": TokenScope.RELEASES_WRITE}

    @extend_schema(operation_id="releases_default_retrieve", tags=["releases"], responses=DefaultReleaseOutput,
                   description="The release your new customers start on (null: the runtime's installed agents). "
                               "A rollout that succeeds makes its release the default.")
    def get(self, request: Request) -> Response:
        default = DefaultRelease.objects.filter(operator=self.operator(request)).select_related("release").first()
        return Response(DefaultReleaseOutput({"release": default.release if default else None}).data)

    @extend_schema(operation_id="releases_default_update", tags=["releases"], request=DefaultReleaseInput,
                   responses={200: DefaultReleaseOutput, 404: _NO_SUCH_RELEASE},
                   description="Make one of your releases the default for new customers. Running customers are "
                               "not restarted: roll the release out to move them.")
    def put(self, request: Request) -> Response:
        body = self.body(request, DefaultReleaseInput)
        default = release_default_set(operator=self.operator(request), release_id=body["release"],
                                      actor=self.actor(request))
        return Response(DefaultReleaseOutput({"release": default.release}).data)


def _tenant_release(tenant: Tenant) -> dict[str, object]:
    assignment = tenant_release_seen(tenant)
    _boots, running = booted_release(tenant, since=None) if tenant.status in RESTARTABLE else (0, None)
    return {"tenant_id": tenant.pk, "release": assignment.release, "pinned": assignment.pinned,
            "running": running, "updated_at": assignment.updated_at}


class TenantReleaseView(ScopedView):
    scopes = {"GET": TokenScope.RELEASES_READ, "PUT": TokenScope.RELEASES_WRITE}

    @extend_schema(operation_id="tenants_release_retrieve", tags=["releases"], responses=TenantReleaseOutput,
                   description="The release the tenant runs, whether it is pinned, and what its instance last "
                               "booted with.")
    def get(self, request: Request, tenant_id: str) -> Response:
        tenant = tenant_get(operator=self.operator(request), tenant_id=tenant_id, live=True)
        return Response(TenantReleaseOutput(_tenant_release(tenant)).data)

    @extend_schema(operation_id="tenants_release_update", tags=["releases"], request=TenantReleaseInput,
                   responses={202: TenantReleaseOutput},
                   description="Pin the tenant to one of your releases (`pinned: true`), or let it follow your "
                               "default (`pinned: false`). When what it runs changes, a worker restarts its "
                               "instance at the next step boundary and it resumes from its checkpoint. 409 while "
                               "a rollout is moving the tenant, or unless it is ready or degraded.")
    def put(self, request: Request, tenant_id: str) -> Response:
        tenant = tenant_get(operator=self.operator(request), tenant_id=tenant_id, live=True)
        body = self.body(request, TenantReleaseInput)
        tenant_release_pin(tenant=tenant, release_id=body.get("release"), pinned=body["pinned"],
                           actor=self.actor(request))
        return Response(TenantReleaseOutput(_tenant_release(tenant)).data, status=status.HTTP_202_ACCEPTED)


class TenantAgentConfigView(ScopedView):
    """Operator tokens only: a customer token is refused (403) even read-only, as for the tenant's release; the
    configuration is the operator's setting of its product, and the portal shows it to the operator's staff."""

    scopes = {"GET": TokenScope.RELEASES_READ, "PUT": TokenScope.RELEASES_WRITE}

    @extend_schema(operation_id="tenants_agent_config_retrieve", tags=["releases"], responses=AgentConfigOutput,
                   description="The customer's agent configuration: the schema and defaults of the release it "
                               "runs, its overrides, and the effective configuration its agent's next task gets "
                               "as ctx.config. Credential properties show the credential's name, never a value.")
    def get(self, request: Request, tenant_id: str) -> Response:
        tenant = tenant_get(operator=self.operator(request), tenant_id=tenant_id, live=True)
        return Response(AgentConfigOutput(tenant_agent_config_get(tenant=tenant)).data)

    @extend_schema(operation_id="tenants_agent_config_update", tags=["releases"], request=AgentConfigInput,
                   responses={200: AgentConfigOutput},
                   description="Replace the customer's overrides. Validated against the schema of the release it "
                               "runs (400 naming the field, e.g. `overrides.max_refund`); a credential property "
                               "must name a credential stored in the customer's vault (400 otherwise). Audited "
                               "(`agent_config.update`, keys only). No restart: the next task starts with it; "
                               "a task under way keeps the values it started with.")
    def put(self, request: Request, tenant_id: str) -> Response:
        tenant = tenant_get(operator=self.operator(request), tenant_id=tenant_id, live=True)
        body = self.body(request, AgentConfigInput)
        view = tenant_agent_config_set(tenant=tenant, overrides=body["overrides"], actor=self.actor(request))
        return Response(AgentConfigOutput(view).data)


class RolloutListCreateView(ScopedView):
    scopes = {"GET": TokenScope.RELEASES_READ, "POST": TokenScope.RELEASES_WRITE}

    @extend_schema(operation_id="rollouts_list", tags=["rollouts"], responses=RolloutOutput(many=True),
                   description="Your rollouts, newest first (the latest 100).")
    def get(self, request: Request) -> Response:
        rollouts = rollout_list(operator=self.operator(request))[:100]
        return Response(RolloutOutput(rollouts, many=True).data)

    @extend_schema(operation_id="rollouts_create", tags=["rollouts"], request=RolloutCreateInput,
                   responses={202: RolloutDetailOutput, 404: _NO_SUCH_RELEASE},
                   description="Roll one of your releases out to every unpinned customer not on it yet: a canary "
                               "wave (`canary` tenants or `canary_percent`), then waves of `wave_size`, each held "
                               "under the health gate for `soak_s` seconds (instance ready and healthy, no restart, "
                               "no task failed or blocked, no effect blocked or in doubt). A wave that fails the "
                               "gate rolls every upgraded tenant back to its previous release; later waves are "
                               "never touched. On success the release becomes your default. 409 while another of "
                               "your rollouts is active.")
    def post(self, request: Request) -> Response:
        body = self.body(request, RolloutCreateInput)
        rollout = rollout_create(operator=self.operator(request), release_id=body["release"],
                                 actor=self.actor(request), canary=body.get("canary"),
                                 canary_percent=body.get("canary_percent"), wave_size=body.get("wave_size"),
                                 soak_s=body.get("soak_s"))
        return Response(RolloutDetailOutput(rollout).data, status=status.HTTP_202_ACCEPTED)


class RolloutDetailView(ScopedView):
    scopes = {"GET": TokenScope.RELEASES_READ}

    @extend_schema(operation_id="rollouts_retrieve", tags=["rollouts"], responses=RolloutDetailOutput,
                   description="One rollout with every tenant's wave, status, previous release and error.")
    def get(self, request: Request, rollout_id: str) -> Response:
        rollout = rollout_get(operator=self.operator(request), rollout_id=rollout_id)
        return Response(RolloutDetailOutput(rollout).data)


_ROLLOUT_ACTIONS = {"pause": rollout_pause, "resume": rollout_resume, "abort": rollout_abort,
                    "rollback": rollout_rollback}


def _action_view(name: str, description: str) -> type[ScopedView]:
    """One view per rollout action (its own operation in the schema), each calling its one service."""

    @extend_schema(operation_id=f"rollouts_{name}", tags=["rollouts"], request=None,
                   responses={202: RolloutDetailOutput}, description=description)
    def post(self: ScopedView, request: Request, rollout_id: str) -> Response:
        rollout = rollout_get(operator=self.operator(request), rollout_id=rollout_id)
        self.body(request, NoInput)
        rollout = _ROLLOUT_ACTIONS[name](rollout=rollout, actor=self.actor(request))
        return Response(RolloutDetailOutput(rollout).data, status=status.HTTP_202_ACCEPTED)

    return type(f"Rollout{name.title()}View", (ScopedView,), {"scopes": {"POST": TokenScope.RELEASES_WRITE},
                                                              "post": post})


RolloutPauseView = _action_view("pause", "Stop between tenants: the one being upgraded finishes, nothing else "
                                         "starts until resume. 409 unless running.")
RolloutResumeView = _action_view("resume", "Continue a paused rollout where it stopped. 409 unless paused.")
RolloutAbortView = _action_view("abort", "Stop for good: upgraded tenants keep the new release, the others are "
                                         "never touched. 409 unless running or paused.")
RolloutRollbackView = _action_view("rollback", "Return every tenant this rollout upgraded to its previous "
                                               "release (also after it succeeded or was aborted, unless a later "
                                               "rollout has started). 409 otherwise.")
