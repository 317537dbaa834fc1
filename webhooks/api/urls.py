from django.urls import path

from . import views

urlpatterns = [
    path("events", views.EventListView.as_view(), name="event-list"),
    path("events/<str:event_id>", views.EventDetailView.as_view(), name="event-detail"),
    path("webhook-endpoints", views.EndpointListCreateView.as_view(), name="webhook-endpoint-list"),
    path("webhook-endpoints/<str:endpoint_id>", views.EndpointDetailView.as_view(), name="webhook-endpoint-detail"),
    path("webhook-endpoints/<str:endpoint_id>/test", views.EndpointTestView.as_view(), name="webhook-endpoint-test"),
    path("webhook-endpoints/<str:endpoint_id>/deliveries", views.EndpointDeliveriesView.as_view(),
         name="webhook-endpoint-deliveries"),
    path("webhook-deliveries/<str:delivery_id>/replay", views.DeliveryReplayView.as_view(),
         name="webhook-delivery-replay"),
]
