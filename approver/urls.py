from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from .views import site

handler404 = site.not_found

urlpatterns = [
    path("", site.home, name="home"),
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("health/", site.health, name="health"),
    path("admin/", admin.site.urls),
    path("", include("journal.auth.oauth_urls")),
    path("", include("journal.urls")),
    path("", include("approver.plan_urls")),
]
