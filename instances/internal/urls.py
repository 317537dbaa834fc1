from django.urls import path

from . import views

urlpatterns = [
    path("credentials/<str:name>", views.CredentialDeliveryView.as_view(), name="internal-credential"),
    path("object-keys", views.ObjectKeysView.as_view(), name="internal-object-keys"),
    path("s3-credentials/<str:tenant_id>", views.S3CredentialsView.as_view(), name="internal-s3-credentials"),
    path("agent-config", views.AgentConfigView.as_view(), name="internal-agent-config"),
    path("connections/<str:provider>", views.ConnectionDeliveryView.as_view(), name="internal-connection"),
    path("heartbeat", views.HeartbeatView.as_view(), name="internal-heartbeat"),
]
