from django.urls import path

from . import views

urlpatterns = [
    path("agent-config", views.AgentConfigDeliveryView.as_view(), name="internal-agent-config"),
]
