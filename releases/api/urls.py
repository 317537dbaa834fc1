from django.urls import path

from . import views

urlpatterns = [
    path("releases", views.ReleaseListCreateView.as_view(), name="release-list"),
    path("releases/default", views.DefaultReleaseView.as_view(), name="release-default"),
    path("releases/<str:release_id>", views.ReleaseDetailView.as_view(), name="release-detail"),
    path("tenants/<str:tenant_id>/release", views.TenantReleaseView.as_view(), name="tenant-release"),
    path("tenants/<str:tenant_id>/agent-config", views.TenantAgentConfigView.as_view(), name="tenant-agent-config"),
    path("rollouts", views.RolloutListCreateView.as_view(), name="rollout-list"),
    path("rollouts/<str:rollout_id>", views.RolloutDetailView.as_view(), name="rollout-detail"),
    path("rollouts/<str:rollout_id>/pause", views.RolloutPauseView.as_view(), name="rollout-pause"),
    path("rollouts/<str:rollout_id>/resume", views.RolloutResumeView.as_view(), name="rollout-resume"),
    path("rollouts/<str:rollout_id>/abort", views.RolloutAbortView.as_view(), name="rollout-abort"),
    path("rollouts/<str:rollout_id>/rollback", views.RolloutRollbackView.as_view(), name="rollout-rollback"),
]
