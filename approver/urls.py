from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from django.views.generic import RedirectView

from .views import site

handler404 = site.not_found

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="journal:run_list", permanent=False)),
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("health/", site.health, name="health"),
    path("admin/", admin.site.urls),
    path("", include("journal.oauth_urls")),
    path("", include("journal.urls")),
    path("", include("approver.plan_urls")),
]
