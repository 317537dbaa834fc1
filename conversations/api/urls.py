from django.urls import path

from . import views

T = "tenants/<str:tenant_id>"

urlpatterns = [
    path(f"{T}/threads/<str:thread>", views.ThreadView.as_view(), name="thread"),
    path(f"{T}/threads/<str:thread>/messages", views.ThreadMessagesView.as_view(), name="thread-messages"),
    path(f"{T}/threads/<str:thread>/messages/<str:message_id>/reply", views.MessageReplyView.as_view(),
         name="thread-message-reply"),
    path(f"{T}/tasks", views.TaskListView.as_view(), name="tenant-tasks"),
    path(f"{T}/tasks/<str:task_id>", views.TaskDetailView.as_view(), name="tenant-task"),
    path(f"{T}/tasks/<str:task_id>/cancel", views.TaskCancelView.as_view(), name="tenant-task-cancel"),
    path(f"{T}/tasks/<str:task_id>/retry", views.TaskRetryView.as_view(), name="tenant-task-retry"),
    path(f"{T}/effects", views.EffectListView.as_view(), name="tenant-effects"),
    path(f"{T}/effects/<str:effect_key>/decision", views.EffectDecisionView.as_view(), name="tenant-effect-decision"),
    path(f"{T}/logs", views.LogsView.as_view(), name="tenant-logs"),
    path(f"{T}/usage/limits", views.TenantUsageLimitsView.as_view(), name="tenant-usage-limits"),
    path(f"{T}/customer-tokens", views.CustomerTokenView.as_view(), name="customer-tokens"),
    path(f"{T}/customer-tokens/<str:prefix>", views.CustomerTokenDetailView.as_view(), name="customer-token"),
]
