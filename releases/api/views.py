"""``/api/v1/releases``: upload (validate, then register) and read an operator's agent releases."""

from __future__ import annotations

import json

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.errors import ValidationFailed
from tenants.api.views import ScopedView
from tenants.choices import TokenScope

from ..selectors import release_get, release_list
from ..services import release_create
from .serializers import ReleaseOutput, ReleaseUploadInput


class ReleaseListCreateView(ScopedView):
    scopes = {"GET": TokenScope.RELEASES_READ, "POST": TokenScope.RELEASES_WRITE}
    parser_classes = [MultiPartParser]

    @extend_schema(operation_id="releases_list", tags=["releases"], responses=ReleaseOutput(many=True),
                   description="Your agent releases, newest first.")
    def get(self, request: Request) -> Response:
        return Response(ReleaseOutput(release_list(operator=self.operator(request)), many=True).data)

    @extend_schema(operation_id="releases_create", tags=["releases"],
                   request={"multipart/form-data": ReleaseUploadInput}, responses={201: ReleaseOutput},
                   description="Upload a new version of your agent as a wheel. It is registered only once it "
                               "has passed validation: the digest matches, it is a wheel, every dependency is "
                               "one the runtime has, it installs and imports in a sandbox, and it provides at "
                               "least one agent kind. Otherwise 400 naming the cause, and nothing is kept. A "
                               "version is registered once (409). 413 past RELEASE_MAX_WHEEL_BYTES.")
    def post(self, request: Request) -> Response:
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
