from django.urls import path

from . import api, views
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
    path("api/runs/", api.run_list, name="api_run_list"),
    path("api/runs/<uuid:run_id>/", api.run_detail, name="api_run_detail"),
    path("api/runs/<uuid:run_id>/steps/", api.step_list, name="api_step_list"),
    path("api/runs/<uuid:run_id>/steps/<int:number>/result", api.step_result, name="api_step_result"),
    path("api/openapi.json", api.openapi, name="api_openapi"),
]
