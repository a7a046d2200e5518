from django.urls import path

from . import views
from .auth import oauth

app_name = "journal"

urlpatterns = [
    path("runs/", views.run_list, name="run_list"),
    path("runs/<uuid:run_id>/", views.run_detail, name="run_detail"),
    path("runs/<uuid:run_id>/verify/", views.run_verify, name="run_verify"),
    path("runs/<uuid:run_id>/end/", views.run_end, name="run_end"),
    path("runs/<uuid:run_id>/release/", views.run_release, name="run_release"),
    path("agents/", views.agent_list, name="agent_list"),
    path("agents/<slug:name>/", views.agent_detail, name="agent_detail"),
    path(
        "agents/<slug:name>/clients/<int:authorization_id>/revoke/",
        oauth.revoke_client,
        name="agent_client_revoke",
    ),
]
