from django.urls import path

from . import views

urlpatterns = [
    path("egress-rules", views.RuleListCreateView.as_view(), name="egress-rule-list"),
    path("egress-rules/<str:rule_id>", views.RuleDetailView.as_view(), name="egress-rule-detail"),
    path("tenants/<str:tenant_id>/egress-decisions", views.DecisionListView.as_view(), name="egress-decision-list"),
]
