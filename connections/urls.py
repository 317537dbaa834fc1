from django.urls import path

from .views import oauth_callback

urlpatterns = [
    path("callback", oauth_callback, name="oauth-callback"),
]
