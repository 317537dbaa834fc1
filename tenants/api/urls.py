from django.urls import path

from . import views

# The tenant endpoints are provisioning's (provisioning/api/urls.py), included beside this under api/v1/.
urlpatterns = [
    path("plans", views.PlanListView.as_view(), name="plan-list"),
]
