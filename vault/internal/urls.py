from django.urls import path

from . import views

urlpatterns = [
    path("credentials/<str:name>", views.CredentialDeliveryView.as_view(), name="internal-credential"),
    path("object-keys", views.ObjectKeysView.as_view(), name="internal-object-keys"),
    path("heartbeat", views.HeartbeatView.as_view(), name="internal-heartbeat"),
]
