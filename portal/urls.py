"""The whole URL map of an operator host (set per request by ``portal.middleware``)."""

from django.contrib.auth import views as auth_views
from django.urls import include, path

from branding.views import asset

from . import (
    action_views,
    agent_config_views,
    connection_views,
    mcp_server_views,
    price_views,
    schedule_views,
    team_views,
    views,
)
from . import conversation_views as agent
from . import releases_views as rel
from . import webhook_views as hooks

# This module is a root URLconf (set per request), so the "portal" namespace is declared with include().
portal_patterns = [
    path("", views.home, name="home"),
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(next_page="portal:login"), name="logout"),
    path("password-reset/", team_views.PasswordResetView.as_view(), name="password-reset"),
    path("password-reset/sent/", team_views.PasswordResetDoneView.as_view(), name="password-reset-done"),
    path("password-reset/<uidb64>/<token>/", team_views.PasswordResetConfirmView.as_view(),
         name="password-reset-confirm"),
    path("password-reset/done/", team_views.PasswordResetCompleteView.as_view(), name="password-reset-complete"),
    path("invitations/<str:token>/", team_views.invitation_accept_view, name="invitation-accept"),
    path("team/", team_views.team, name="team"),
    path("team/invitations/<uuid:invitation_id>/withdraw/", team_views.invitation_revoke_view,
         name="invitation-revoke"),
    path("team/members/<int:membership_id>/remove/", team_views.member_remove_view, name="member-remove"),
    path("customers/", views.onboard, name="onboard"),
    path("customers/<uuid:tenant_id>/", views.customer, name="customer"),
    path("customers/<uuid:tenant_id>/live", views.customer_live, name="customer-live"),
    path("customers/<uuid:tenant_id>/actions/<str:action>/", action_views.customer_action, name="customer-action"),
    path("customers/<uuid:tenant_id>/credentials/", views.credential_add, name="credential-add"),
    path("customers/<uuid:tenant_id>/connections/", connection_views.connection_start_view, name="connection-start"),
    path("customers/<uuid:tenant_id>/connections/<uuid:connection_id>/disconnect/",
         connection_views.connection_disconnect_view, name="connection-disconnect"),
    path("customers/<uuid:tenant_id>/mcp-servers/", mcp_server_views.mcp_server_add, name="mcp-server-add"),
    path("customers/<uuid:tenant_id>/mcp-servers/<uuid:server_id>/remove/", mcp_server_views.mcp_server_remove,
         name="mcp-server-remove"),
    path("customers/<uuid:tenant_id>/credentials/<str:name>/revoke/", views.credential_revoke_view,
         name="credential-revoke"),
    path("customers/<uuid:tenant_id>/threads/<str:thread>/messages", agent.chat_send, name="chat-send"),
    path("customers/<uuid:tenant_id>/threads/<str:thread>/messages/<str:message_id>/reply", agent.chat_reply,
         name="chat-reply"),
    path("customers/<uuid:tenant_id>/threads/<str:thread>/policy", agent.thread_policy, name="thread-policy"),
    path("customers/<uuid:tenant_id>/schedules/", schedule_views.schedule_add, name="schedule-add"),
    path("customers/<uuid:tenant_id>/schedules/<uuid:schedule_id>/delete/", schedule_views.schedule_delete_view,
         name="schedule-delete"),
    path("customers/<uuid:tenant_id>/schedules/<uuid:schedule_id>/<str:action>/", schedule_views.schedule_change,
         name="schedule-change"),
    path("customers/<uuid:tenant_id>/tasks/", agent.tasks, name="tasks"),
    path("customers/<uuid:tenant_id>/tasks/<str:task_id>/", agent.task, name="task"),
    path("customers/<uuid:tenant_id>/tasks/<str:task_id>/retry", agent.task_retry, name="task-retry"),
    path("customers/<uuid:tenant_id>/tasks/<str:task_id>/cancel", agent.task_cancel, name="task-cancel"),
    path("customers/<uuid:tenant_id>/logs/", agent.logs, name="logs"),
    path("customers/<uuid:tenant_id>/release/", rel.customer_release, name="customer-release"),
    path("customers/<uuid:tenant_id>/agent-config/", agent_config_views.customer_agent_config,
         name="customer-agent-config"),
    path("tokens/", views.tokens, name="tokens"),
    path("tokens/<str:prefix>/revoke/", views.token_revoke, name="token-revoke"),
    path("branding/", views.branding, name="branding"),
    path("branding/preview", views.branding_preview, name="branding-preview"),
    path("branding/status", views.branding_status, name="branding-status"),
    path("branding/assets/<str:sha256>", asset, name="asset"),
    path("releases/", rel.releases, name="releases"),
    path("releases/upload/", rel.release_upload, name="release-upload"),
    path("releases/<uuid:release_id>/default/", rel.release_default, name="release-default"),
    path("releases/<uuid:release_id>/rollout/", rel.release_rollout, name="release-rollout"),
    path("rollouts/", rel.rollouts, name="rollouts"),
    path("rollouts/<uuid:rollout_id>/", rel.rollout, name="rollout"),
    path("rollouts/<uuid:rollout_id>/live", rel.rollout_live, name="rollout-live"),
    path("rollouts/<uuid:rollout_id>/actions/<str:action>/", rel.rollout_action, name="rollout-action"),
    path("prices/", price_views.prices, name="prices"),
    path("prices/<int:price_id>/", price_views.price_edit, name="price-edit"),
    path("prices/<int:price_id>/delete/", price_views.price_delete, name="price-delete"),
    path("webhooks/", hooks.webhooks, name="webhooks"),
    path("webhooks/<uuid:endpoint_id>/", hooks.webhook_endpoint, name="webhook-endpoint"),
    path("webhooks/<uuid:endpoint_id>/test/", hooks.webhook_test, name="webhook-test"),
    path("webhooks/<uuid:endpoint_id>/delete/", hooks.webhook_delete, name="webhook-delete"),
    path("webhooks/deliveries/<uuid:delivery_id>/replay/", hooks.webhook_replay, name="webhook-replay"),
]

urlpatterns = [
    path("", include((portal_patterns, "portal"))),
    # The OAuth redirect back, on the operator's own host: the customer never sees the control plane's name.
    path("oauth/", include("connections.urls")),
]
