from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from .views import site
from .web_api import api

handler404 = site.not_found

urlpatterns = [
    path("", site.home, name="home"),
    path("login/", site.SignIn.as_view(), name="login"),
    path("oidc/", include("mozilla_django_oidc.urls")),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("health/", site.health, name="health"),
    path("metrics", site.metrics, name="metrics"),
    path("admin/", admin.site.urls),
    path("api/", api.urls),
    path("", include("journal.auth.oauth_urls")),
    path("", include("journal.urls")),
    path("", include("approver.plan_urls")),
]
