from django.urls import path

from . import views

app_name = "branding"
urlpatterns = [
    path("assets/<str:sha256>", views.asset, name="asset"),
]
