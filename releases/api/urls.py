from django.urls import path

from . import views

urlpatterns = [
    path("releases", views.ReleaseListCreateView.as_view(), name="release-list"),
    path("releases/<str:release_id>", views.ReleaseDetailView.as_view(), name="release-detail"),
]
