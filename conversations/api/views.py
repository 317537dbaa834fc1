"""The tenant's conversation API: threads, reply streams, tasks, effects, logs, customer tokens.

Thin views: each checks the principal's tenant and scope (``TenantAPIView``), validates its input and
calls one service or selector. Writes answer 201/200 when the instance took them at once and 202 when
they wait in the durable inbox; instance problems come back with the instance's status and code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.handlers.asgi import ASGIRequest
from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.errors import NotFound
from controlplane.openapi import idempotency_key, limit_parameter
from controlplane.strict import StrictQueryMixin, validate_idempotency_key
from controlplane.throttles import OperatorThrottle
from conversations.choices import EffectState, InboxStatus, LogLevel, TaskStatus
from conversations.monthly_limits import monthly_limits
from conversations.selectors import (
    effect_list,
    inbox_message_get,
    log_tail,
    task_detail,
    task_list,
    tenant_for_operator,
    thread_messages,
    thread_setting,
)
from conversations.services import (
    EFFECT_KEY_RE,
    THREAD_RE,
    Accepted,
    effect_decide,
    message_send,
    task_cancel,
    task_retry,
    task_submit,
    thread_policy_set,
)
from conversations.streams import areply_events, reply_events
from conversations.tokens import (
    customer_token_actor,
    customer_token_end_user,
    customer_token_issue,
    customer_token_refused,
    customer_token_revoke,
)
from instances.client import InstanceProblem, InstanceUnavailable
from tenants.actors import Actor
from tenants.api.authentication import OperatorPrincipal
from tenants.api.views import OperatorAPIView, ScopedView
from tenants.choices import TENANT_GONE, TokenScope
from tenants.models import Tenant
from tenants.selectors import tenant_get
from tenants.tokens import CredentialsChanged, Recheck

from .authentication import (
    CustomerPrincipal,
    CustomerTokenAuthentication,
    TenantOperatorAuthentication,
    TenantOperatorPrincipal,
)
from .permissions import HasTenantScope
from .serializers import (
    CustomerTokenInput,
    CustomerTokenOutput,
    DecisionInput,
    EmptyInput,
    InstanceAnswerOutput,
    MessageInput,
    MessageSendOutput,
    TaskInput,
    ThreadOutput,
    ThreadPolicyInput,
    UsageLimitsOutput,
    inbox_item_data,
)

S = TokenScope
IDEMPOTENCY_KEY = idempotency_key()
# Path segments with the patterns the services check, so a schema-valid request is never refused for them.
THREAD = OpenApiParameter("thread", {"type": "string", "pattern": THREAD_RE.pattern}, OpenApiParameter.PATH)
EFFECT_KEY = OpenApiParameter("effect_key", {"type": "string", "pattern": EFFECT_KEY_RE.pattern},
                              OpenApiParameter.PATH)
UNAVAILABLE = OpenApiResponse(description="The instance is not reachable (problem+json, `Retry-After`).")
NOT_RUNNING = OpenApiResponse(description="No instance is meant to run: the tenant is suspended (`tenant-suspended`) "
                                          "or not provisioned yet (`instance-not-ready`).")
QUEUED = OpenApiResponse(InstanceAnswerOutput, description="Accepted durably; delivered when the instance is back.")
# How long a reply stream waits for a message still in the inbox before ``event: timeout``.
REPLY_WAIT_S = 60.0


class EventStreamRenderer(BaseRenderer):
    """Lets ``Accept: text/event-stream`` through content negotiation; errors before the stream are JSON."""

    media_type = "text/event-stream"
    format = "sse"
    charset = None

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        return JSONRenderer().render(data)


class TenantAPIView(StrictQueryMixin, APIView):
    """Shared base: operator or customer token, the scope per method in ``scopes``, the caller's tenant;
    strict query strings (``extra_query_params`` lists what a view reads)."""

    authentication_classes = [CustomerTokenAuthentication, TenantOperatorAuthentication]
    permission_classes = [HasTenantScope]
    throttle_classes = [OperatorThrottle]
    scopes: dict[str, str] = {}

    def tenant(self, request: Request, tenant_id: str):
        principal = request.user
        if isinstance(principal, CustomerPrincipal):
            if str(principal.tenant.pk) != str(tenant_id).lower():
                customer_token_refused(token=principal.token, reason="another tenant", path=request.path,
                                       method=request.method)
                raise NotFound("tenant not found")
            if principal.tenant.status in TENANT_GONE:
                raise NotFound("tenant not found")
            return principal.tenant
        if isinstance(principal, TenantOperatorPrincipal) and principal.asked == str(tenant_id):
            if principal.tenant is None:  # another operator's, missing or being deleted
                raise NotFound("tenant not found")
            return principal.tenant  # looked up with the token (one statement)
        return tenant_for_operator(operator=principal.operator, tenant_id=tenant_id)

    # True on a view whose POST writes through ``accepted`` (its authentication may then come from the cache).
    write_rechecks_credentials = False

    def accepted(self, request: Request, tenant_id: str, write: Callable[[Tenant, Recheck | None], Accepted],
                 ) -> Accepted:
        """``write(tenant, recheck)``: a write into the inbox for this request's tenant. A view that calls it sets
        ``write_rechecks_credentials``: its POST may then be authenticated from the process's cache, and ``recheck``
        (None when verified just now) is what the write confirms in its own statement. When that no longer holds
        (the token revoked, the tenant's status or plan changed) the write has undone itself; the request is
        authenticated again, uncached, and the write runs once more as it would have on a miss (401 for a revoked
        token, 404 for a tenant being deleted, held for a suspended one)."""
        principal = request.user
        recheck = principal.recheck if isinstance(principal, TenantOperatorPrincipal) else None
        try:
            return write(self.tenant(request, tenant_id), recheck)
        except CredentialsChanged:
            request.user, request.auth = TenantOperatorAuthentication().authenticate_again(request)
            return write(self.tenant(request, tenant_id), None)

    def actor(self, request: Request) -> Actor:
        if isinstance(request.user, CustomerPrincipal):
            return customer_token_actor(request.user.token)
        return Actor.for_token(request.auth)

    @staticmethod
    def end_user(request: Request, named: object) -> str | None:
        """The end user this request acts for: its customer token's, else the one it names (docs/connections.md)."""
        token = request.user.token if isinstance(request.user, CustomerPrincipal) else None
        return customer_token_end_user(token, named)

    @staticmethod
    def idempotency_key(request: Request) -> str | None:
        return request.headers.get("Idempotency-Key")

    @staticmethod
    def body(request: Request, serializer: type) -> dict[str, Any]:
        data = request.data if request.body else {}
        parsed = serializer(data=data)
        parsed.is_valid(raise_exception=True)
        return dict(parsed.validated_data)

    def handle_exception(self, exc: Exception) -> Response:
        response = super().handle_exception(exc)
        if isinstance(exc, InstanceUnavailable):
            response["Retry-After"] = str(exc.retry_after_s)
        return response


def accepted_response(accepted: Accepted, *, created_status: int = 201) -> Response:
    """201/200 with the instance's answer, 202 while pending, or the instance's problem if it refused."""
    item = accepted.item
    if item.status == InboxStatus.REFUSED:
        raise InstanceProblem.from_problem(item.response or {})
    if item.status == InboxStatus.PENDING:
        return Response({"inbox": inbox_item_data(item)}, status=status.HTTP_202_ACCEPTED)
    code = created_status if accepted.created else status.HTTP_200_OK
    return Response({**(item.response or {}), "inbox": inbox_item_data(item)}, status=code)


class ThreadMessagesView(TenantAPIView):
    scopes = {"GET": S.CONVERSATIONS_READ, "POST": S.CONVERSATIONS_WRITE}
    write_rechecks_credentials = True  # its POST writes through ``accepted``
    extra_query_params = ("after", "before", "limit")

    @extend_schema(operation_id="threads_messages_list", tags=["conversations"],
                   parameters=[THREAD, OpenApiParameter("after", {"type": "integer", "minimum": 0, "maximum": 2**62},
                                                required=False),
                               OpenApiParameter("before", {"type": "integer", "minimum": 1, "maximum": 2**62},
                                                required=False),
                               limit_parameter(200, 50)],
                   responses={200: OpenApiTypes.OBJECT, 409: NOT_RUNNING, 503: UNAVAILABLE},
                   description="The thread, oldest first, with cursors: `next` as `after` for newer, `prev` as "
                               "`before` for older; both together read the window between them. Read from the "
                               "instance: 503 while it is down.")
    def get(self, request: Request, tenant_id: str, thread: str) -> Response:
        tenant = self.tenant(request, tenant_id)
        q = request.query_params
        return Response(thread_messages(tenant=tenant, thread=thread, after=q.get("after"), before=q.get("before"),
                                        limit=q.get("limit")))

    @extend_schema(operation_id="threads_messages_create", tags=["conversations"], request=MessageInput,
                   parameters=[THREAD, IDEMPOTENCY_KEY],
                   responses={201: MessageSendOutput, 200: MessageSendOutput, 202: QUEUED,
                              409: OpenApiResponse(description="`thread-busy` (policy `reject`: `task` names the "
                                                               "running task) or `rollback-refused` (`effect` names "
                                                               "the effect a rollback would forget).")},
                   description="Append a user message; the agent answers it as a task. 202 when the instance "
                               "is down: the message waits in the durable inbox and is answered once it is back. "
                               "Read the reply from `reply_url` (server-sent events). `policy` decides what it "
                               "does to the thread's run still going (docs/conversations.md).")
    def post(self, request: Request, tenant_id: str, thread: str) -> Response:
        self.tenant(request, tenant_id)  # a 404 before the body's 400, as before
        body = self.body(request, MessageInput)
        accepted = self.accepted(request, tenant_id, lambda tenant, recheck: message_send(
            tenant=tenant, thread=thread, content=body["content"], policy=body.get("policy"),
            idempotency_key=self.idempotency_key(request), actor=self.actor(request),
            end_user=self.end_user(request, body.get("end_user")), settle_after_response=True, recheck=recheck))
        response = accepted_response(accepted)
        response.data["reply_url"] = request.build_absolute_uri(
            f"/api/v1/tenants/{accepted.item.tenant_id}/threads/{accepted.item.thread}/messages/{accepted.item.pk}"
            "/reply")
        return response


class ThreadView(TenantAPIView):
    """A thread's settings (its policy). Kept by the control plane, so a thread may get one before its first
    message."""

    scopes = {"GET": S.CONVERSATIONS_READ, "PUT": S.CONVERSATIONS_WRITE}

    @extend_schema(operation_id="threads_retrieve", tags=["conversations"], parameters=[THREAD],
                   responses={200: ThreadOutput}, description="The thread's policy (`enqueue` unless set).")
    def get(self, request: Request, tenant_id: str, thread: str) -> Response:
        tenant = self.tenant(request, tenant_id)
        return Response(ThreadOutput(thread_setting(tenant=tenant, thread=thread)).data)

    @extend_schema(operation_id="threads_update", tags=["conversations"], request=ThreadPolicyInput,
                   parameters=[THREAD], responses={200: ThreadOutput},
                   description="Set the thread's policy for a message that arrives while its previous run is "
                               "still going: `reject`, `enqueue` (the default), `interrupt` or `rollback`. Audited "
                               "(`conversation.thread_policy_set`).")
    def put(self, request: Request, tenant_id: str, thread: str) -> Response:
        tenant = self.tenant(request, tenant_id)
        body = self.body(request, ThreadPolicyInput)
        setting = thread_policy_set(tenant=tenant, thread=thread, policy=body["policy"], actor=self.actor(request))
        return Response(ThreadOutput({"thread": setting.thread, "policy": setting.policy}).data)


class MessageReplyView(TenantAPIView):
    scopes = {"GET": S.CONVERSATIONS_READ}
    renderer_classes = [JSONRenderer, EventStreamRenderer]

    def perform_content_negotiation(self, request: Request, force: bool = False) -> tuple[BaseRenderer, str]:
        # By Accept only: no ?format= override (the stream is either events or, before it starts, a problem).
        wants_events = "text/event-stream" in request.META.get("HTTP_ACCEPT", "")
        renderer = EventStreamRenderer() if wants_events else JSONRenderer()
        return renderer, renderer.media_type

    @extend_schema(operation_id="threads_messages_reply", tags=["conversations"],
                   parameters=[THREAD, OpenApiParameter("format", exclude=True)],
                   responses={(200, "text/event-stream"): OpenApiTypes.STR},
                   description="Server-sent events of the reply: `delta` (streamed text; restart it when "
                               "`attempt` changes), `reply` (the committed message), `status`, `end`. While the "
                               "message waits in the inbox: `queued` and keep-alives, then `timeout` after about "
                               "a minute. `interrupted` if the instance went away mid-reply: reconnect.")
    def get(self, request: Request, tenant_id: str, thread: str, message_id: str) -> StreamingHttpResponse:
        tenant = self.tenant(request, tenant_id)
        item = inbox_message_get(tenant=tenant, thread=thread, message_id=message_id)
        # Under ASGI (the reply-stream tier, controlplane.asgi) the stream runs on the event loop and this thread
        # is free as soon as the view returns; under WSGI it is the thread's until the reply ends.
        events = areply_events if isinstance(request._request, ASGIRequest) else reply_events
        response = StreamingHttpResponse(events(tenant=tenant, item=item, wait_s=REPLY_WAIT_S),
                                         content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        return response


class TaskListView(TenantAPIView):
    scopes = {"GET": S.TASKS_READ, "POST": S.TASKS_WRITE}
    write_rechecks_credentials = True  # its POST writes through ``accepted``
    extra_query_params = ("status", "limit", "before")

    @extend_schema(operation_id="tasks_list", tags=["tasks"],
                   parameters=[OpenApiParameter("status", str, enum=TaskStatus.values, required=False),
                               limit_parameter(200, 50),
                               OpenApiParameter("before", str, required=False, description="A task id (`next`).")],
                   responses={200: OpenApiTypes.OBJECT, 409: NOT_RUNNING, 503: UNAVAILABLE},
                   description="The instance's tasks, newest first.")
    def get(self, request: Request, tenant_id: str) -> Response:
        tenant = self.tenant(request, tenant_id)
        q = request.query_params
        return Response(task_list(tenant=tenant, status=q.get("status"), limit=q.get("limit"),
                                  before=q.get("before")))

    @extend_schema(operation_id="tasks_create", tags=["tasks"], request=TaskInput, parameters=[IDEMPOTENCY_KEY],
                   responses={201: InstanceAnswerOutput, 200: InstanceAnswerOutput, 202: QUEUED},
                   description="Submit a task; 202 while the instance is down (it waits in the inbox). "
                               "`inbox.id` is the task id.")
    def post(self, request: Request, tenant_id: str) -> Response:
        self.tenant(request, tenant_id)  # a 404 before the body's 400, as before
        body = self.body(request, TaskInput)
        return accepted_response(self.accepted(request, tenant_id, lambda tenant, recheck: task_submit(
            tenant=tenant, kind=body["kind"], params=body["params"], idempotency_key=self.idempotency_key(request),
            actor=self.actor(request), end_user=self.end_user(request, body.get("end_user")),
            settle_after_response=True, recheck=recheck)))


class TaskDetailView(TenantAPIView):
    scopes = {"GET": S.TASKS_READ}

    @extend_schema(operation_id="tasks_retrieve", tags=["tasks"], responses={200: OpenApiTypes.OBJECT,
                                                                             409: NOT_RUNNING, 503: UNAVAILABLE},
                   description="Status, steps with timings, every step event (start, done, ...) in order, case file, "
                               "effects, judgments and result.")
    def get(self, request: Request, tenant_id: str, task_id: str) -> Response:
        return Response(task_detail(tenant=self.tenant(request, tenant_id), task_id=task_id))


class TaskCancelView(TenantAPIView):
    scopes = {"POST": S.TASKS_WRITE}

    @extend_schema(operation_id="tasks_cancel", tags=["tasks"], request=EmptyInput, parameters=[IDEMPOTENCY_KEY],
                   responses={200: InstanceAnswerOutput, 202: QUEUED},
                   description="Cancel a pending, running or blocked task (409 if it already ended).")
    def post(self, request: Request, tenant_id: str, task_id: str) -> Response:
        tenant = self.tenant(request, tenant_id)
        self.body(request, EmptyInput)
        return accepted_response(task_cancel(tenant=tenant, task_id=task_id, actor=self.actor(request),
                                             idempotency_key=self.idempotency_key(request)),
                                 created_status=status.HTTP_200_OK)


class TaskRetryView(TenantAPIView):
    scopes = {"POST": S.TASKS_WRITE}

    @extend_schema(operation_id="tasks_retry", tags=["tasks"], request=EmptyInput, parameters=[IDEMPOTENCY_KEY],
                   responses={200: InstanceAnswerOutput, 202: QUEUED},
                   description="Run a blocked or failed (poison) task again from its last checkpoint, once its "
                               "cause is fixed: steps already done are not re-run, committed effects are not "
                               "repeated, the attempt count starts again. Audited; 409 for a task in any other "
                               "state.")
    def post(self, request: Request, tenant_id: str, task_id: str) -> Response:
        tenant = self.tenant(request, tenant_id)
        self.body(request, EmptyInput)
        return accepted_response(task_retry(tenant=tenant, task_id=task_id, actor=self.actor(request),
                                            idempotency_key=self.idempotency_key(request)),
                                 created_status=status.HTTP_200_OK)


class EffectListView(TenantAPIView):
    scopes = {"GET": S.EFFECTS_READ}
    extra_query_params = ("state", "limit")

    @extend_schema(operation_id="effects_list", tags=["effects"],
                   parameters=[OpenApiParameter("state", str, enum=EffectState.values, required=False,
                                                description="Default `open` (in doubt or blocked)."),
                               limit_parameter(200, 50)],
                   responses={200: OpenApiTypes.OBJECT, 409: NOT_RUNNING, 503: UNAVAILABLE},
                   description="The instance's effects, newest first: by default the ones waiting for a human "
                               "(in doubt or blocked).")
    def get(self, request: Request, tenant_id: str) -> Response:
        q = request.query_params
        return Response(effect_list(tenant=self.tenant(request, tenant_id), state=q.get("state"),
                                    limit=q.get("limit")))


class EffectDecisionView(TenantAPIView):
    scopes = {"POST": S.EFFECTS_WRITE}

    @extend_schema(operation_id="effects_decide", tags=["effects"], request=DecisionInput,
                   parameters=[EFFECT_KEY, IDEMPOTENCY_KEY], responses={200: InstanceAnswerOutput, 202: QUEUED},
                   description="A human decision on an in-doubt or blocked effect: `performed`, `not_performed` "
                               "or `perform_now`. Audited; 409 when the effect is not open or its task is "
                               "cancelled.")
    def post(self, request: Request, tenant_id: str, effect_key: str) -> Response:
        tenant = self.tenant(request, tenant_id)
        body = self.body(request, DecisionInput)
        return accepted_response(effect_decide(tenant=tenant, effect_key=effect_key, decision=body["decision"],
                                               result=body["result"], note=body["note"], actor=self.actor(request),
                                               idempotency_key=self.idempotency_key(request)),
                                 created_status=status.HTTP_200_OK)


class LogsView(TenantAPIView):
    scopes = {"GET": S.LOGS_READ}
    extra_query_params = ("limit", "level")

    @extend_schema(operation_id="logs_tail", tags=["logs"],
                   parameters=[limit_parameter(2000, 200),
                               OpenApiParameter("level", str, enum=LogLevel.values, required=False)],
                   responses={200: OpenApiTypes.OBJECT, 409: NOT_RUNNING, 503: UNAVAILABLE},
                   description="The last records of the instance's structured log, oldest first.")
    def get(self, request: Request, tenant_id: str) -> Response:
        q = request.query_params
        return Response(log_tail(tenant=self.tenant(request, tenant_id), limit=q.get("limit"),
                                 level=q.get("level")))


class CustomerTokenView(OperatorAPIView):
    """Operator tokens only (the default authentication refuses a customer token with 401)."""

    required_scope = S.CUSTOMER_TOKENS_WRITE

    @extend_schema(operation_id="customer_tokens_create", tags=["customer tokens"], request=CustomerTokenInput,
                   responses={201: CustomerTokenOutput},
                   parameters=[idempotency_key("Accepted for uniformity; every call mints a new token (a token is "
                                               "shown once).")],
                   description="Mint a short-lived token for this tenant only, with some of "
                               "`conversations:read`, `conversations:write`, `tasks:read`, `tasks:write`, for the "
                               "customer's own front end. Shown once.")
    def post(self, request: Request, tenant_id: str) -> Response:
        tenant = tenant_get(operator=self.operator(request), tenant_id=tenant_id)
        validate_idempotency_key(request.headers.get("Idempotency-Key"))  # unused, but held to the same form
        body = CustomerTokenInput(data=request.data)
        body.is_valid(raise_exception=True)
        principal: OperatorPrincipal = request.user
        issued = customer_token_issue(tenant=tenant, scopes=list(body.validated_data["scopes"]),
                                      ttl_s=body.validated_data["ttl_s"], actor=self.actor(request),
                                      created_by=principal.token, end_user=body.validated_data["end_user"])
        return Response({"token": issued.plaintext, "prefix": issued.token.prefix, "tenant": str(tenant.pk),
                         "scopes": issued.token.scopes, "end_user": issued.token.end_user,
                         "expires_at": issued.token.expires_at},
                        status=status.HTTP_201_CREATED, headers={"Cache-Control": "no-store"})


class CustomerTokenDetailView(OperatorAPIView):
    required_scope = S.CUSTOMER_TOKENS_WRITE

    @extend_schema(operation_id="customer_tokens_revoke", tags=["customer tokens"],
                   responses={204: OpenApiResponse(description="Revoked")},
                   description="Revoke a customer token by its prefix; it is refused (401) from then on.")
    def delete(self, request: Request, tenant_id: str, prefix: str) -> Response:
        tenant = tenant_get(operator=self.operator(request), tenant_id=tenant_id)
        customer_token_revoke(tenant=tenant, prefix=prefix, actor=self.actor(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


class TenantUsageLimitsView(ScopedView):
    scopes = {"GET": TokenScope.TENANTS_READ}

    @extend_schema(operation_id="tenants_usage_limits", tags=["usage"], responses={200: UsageLimitsOutput},
                   description="The customer's plan's monthly limits (`max_tasks_per_month`, messages included; "
                               "`max_tokens_per_month`, input and output) and this UTC month's usage against each, "
                               "counted as the inbox counts when it refuses a new task or message with 429 "
                               "`monthly-limit-reached`. `limit_value` null: unlimited.")
    def get(self, request: Request, tenant_id: str) -> Response:
        tenant = tenant_get(operator=self.operator(request), tenant_id=tenant_id)
        limits = monthly_limits(tenant=tenant)
        return Response(UsageLimitsOutput({"tenant": tenant.pk, "plan": tenant.plan_id, "limits": limits}).data)
