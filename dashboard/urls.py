from django.contrib.auth import views as auth_views
from django.urls import path

from . import conversation_views as agent
from . import event_views, fleet_views, posture_views, recovery_views, rollout_views, schedule_views, usage_views, views

app_name = "dashboard"
urlpatterns = [
    path("", views.overview, name="overview"),
    path("live", views.overview_live, name="overview-live"),
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(next_page="dashboard:login"), name="logout"),
    path("tenants/", views.tenant_list, name="tenants"),
    path("tenants/<uuid:tenant_id>/", views.tenant_detail, name="tenant"),
    path("tenants/<uuid:tenant_id>/live", views.tenant_live, name="tenant-live"),
    path("tenants/<uuid:tenant_id>/runs/<uuid:run_id>/<str:action>/", views.tenant_action, name="run-action"),
    path("tenants/<uuid:tenant_id>/actions/<str:action>/", views.tenant_action, name="tenant-action"),
    path("tenants/<uuid:tenant_id>/threads/<str:thread>/messages", agent.chat_send, name="chat-send"),
    path("tenants/<uuid:tenant_id>/threads/<str:thread>/messages/<str:message_id>/reply", agent.chat_reply,
         name="chat-reply"),
    path("tenants/<uuid:tenant_id>/schedules/<uuid:schedule_id>/<str:action>/", schedule_views.schedule_change,
         name="schedule-change"),
    path("tenants/<uuid:tenant_id>/tasks/", agent.tasks, name="tasks"),
    path("tenants/<uuid:tenant_id>/tasks/<str:task_id>/", agent.task, name="task"),
    path("tenants/<uuid:tenant_id>/tasks/<str:task_id>/retry", agent.task_retry, name="task-retry"),
    path("tenants/<uuid:tenant_id>/tasks/<str:task_id>/cancel", agent.task_cancel, name="task-cancel"),
    path("tenants/<uuid:tenant_id>/logs/", agent.logs, name="logs"),
    path("tenants/<uuid:tenant_id>/effects/<str:effect_key>/decide/", agent.effect_decide_view,
         name="effect-decide"),
    path("effects/", agent.effects, name="effects"),
    path("isolation/", posture_views.isolation, name="isolation"),
    path("recoveries/", recovery_views.recoveries, name="recoveries"),
    path("events/", event_views.events, name="events"),
    path("fleet/", fleet_views.fleet, name="fleet"),
    path("usage/", usage_views.usage, name="usage"),
    path("tenants/<uuid:tenant_id>/usage/", usage_views.tenant_usage, name="tenant-usage"),
    path("rollouts/", rollout_views.rollouts, name="rollouts"),
    path("rollouts/<uuid:rollout_id>/", rollout_views.rollout, name="rollout"),
    path("rollouts/<uuid:rollout_id>/live", rollout_views.rollout_live, name="rollout-live"),
]
