"""Staff admin for resources, instances and workflows, with a retry action for failed runs."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from controlplane.admin import ReadOnlyAdmin
from controlplane.errors import ApplicationError
from provisioning.models import (
    AgentInstance,
    DatabasePlacement,
    DatabaseServer,
    InstanceWake,
    ProvisionedResource,
    RecoveryEvent,
    WorkflowRun,
    WorkflowStep,
)
from provisioning.services import workflow_retry
from tenants.actors import Actor


@admin.register(ProvisionedResource)
class ProvisionedResourceAdmin(ReadOnlyAdmin):
    list_display = ["tenant", "kind", "driver", "external_id", "status", "updated_at"]
    list_filter = ["kind", "status", "driver"]


@admin.register(InstanceWake)
class InstanceWakeAdmin(ReadOnlyAdmin):
    """Wakes of asleep instances (scale to zero): written by provisioning/fleet/sleep.py only."""

    list_display = ["tenant", "trigger", "outcome", "requested_at", "ready_at", "delivered_at"]
    list_filter = ["outcome", "trigger"]


@admin.register(DatabaseServer)
class DatabaseServerAdmin(ReadOnlyAdmin):
    """Read-only here: servers are added, drained and activated with ``manage.py database_servers`` (audited)."""

    list_display = ["name", "state", "capacity", "auth", "from_settings", "created_at"]
    list_filter = ["state"]


@admin.register(DatabasePlacement)
class DatabasePlacementAdmin(ReadOnlyAdmin):
    list_display = ["tenant", "server", "placed_at"]
    list_filter = ["server"]


@admin.register(AgentInstance)
class AgentInstanceAdmin(ReadOnlyAdmin):
    list_display = ["tenant", "status", "driver", "endpoint", "last_heartbeat_at"]
    list_filter = ["status"]
    exclude = ["token_hash"]


class WorkflowStepInline(admin.TabularInline):
    model = WorkflowStep
    extra = 0
    can_delete = False
    readonly_fields = ["name", "position", "status", "attempts", "error", "started_at", "finished_at"]
    exclude = ["output"]

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(WorkflowRun)
class WorkflowRunAdmin(ReadOnlyAdmin):
    list_display = ["tenant", "kind", "status", "created_at", "finished_at"]
    list_filter = ["kind", "status"]
    inlines = [WorkflowStepInline]
    actions = ["retry"]

    @admin.action(description="Retry the failed step of selected runs", permissions=["retry"])
    def retry(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> None:
        for run in queryset:
            try:
                workflow_retry(run=run, actor=Actor.for_user(request.user))
            except ApplicationError as exc:
                self.message_user(request, f"{run}: {exc.detail}", messages.WARNING)
            else:
                self.message_user(request, f"{run}: queued again")

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("provisioning.change_workflowrun")

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(RecoveryEvent)
class RecoveryEventAdmin(ReadOnlyAdmin):
    """What each recovery found and did; recorded by the recovery workflow, never edited by hand."""

    list_display = ["tenant", "reason", "outcome", "detected_at", "resumed_at", "steps_lost"]
    list_filter = ["reason", "outcome"]
    search_fields = ["tenant__slug", "detail"]
