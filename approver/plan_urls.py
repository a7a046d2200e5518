from django.urls import path

from . import api, views

app_name = "approver"

urlpatterns = [
    path("runs/<uuid:run_id>/undo/", views.request_undo, name="request_undo"),
    path("plans/", views.plan_list, name="plan_list"),
    path("plans/<uuid:plan_id>/", views.plan_detail, name="plan_detail"),
    path("plans/<uuid:plan_id>/check/", views.check_again, name="check_again"),
    path("plans/<uuid:plan_id>/cancel/", views.cancel, name="cancel"),
    path("plans/<uuid:plan_id>/abort/", views.abort, name="abort"),
    path("plans/<uuid:plan_id>/pause/", views.pause, name="pause"),
    path("plans/<uuid:plan_id>/resume/", views.resume, name="resume"),
    path("plans/<uuid:plan_id>/items/<int:position>/check/", views.check_outcome, name="check_outcome"),
    path("plans/<uuid:plan_id>/items/<int:position>/settle/", views.settle_outcome, name="settle_outcome"),
    path("plans/<uuid:plan_id>/items/<int:position>/retry/", views.retry_outcome, name="retry_outcome"),
    path("plans/<uuid:plan_id>/sign/", views.sign_begin, name="sign_begin"),
    path("plans/<uuid:plan_id>/sign/complete/", views.sign_complete, name="sign_complete"),
    path("api/plans/<uuid:plan_id>/", api.plan_detail, name="api_plan_detail"),
    path("policies/", views.policy_list, name="policy_list"),
    path("policies/new/", views.policy_edit, name="policy_new"),
    path("policies/<int:policy_id>/", views.policy_edit, name="policy_edit"),
    path("policies/<int:policy_id>/delete/", views.policy_delete, name="policy_delete"),
    path("actions/", views.action_list, name="action_list"),
    path("actions/<uuid:action_id>/", views.action_detail, name="action_detail"),
    path("actions/<uuid:action_id>/sign/", views.action_sign_begin, name="action_sign_begin"),
    path("actions/<uuid:action_id>/sign/complete/", views.action_sign_complete, name="action_sign_complete"),
    path("passkeys/", views.passkey_list, name="passkey_list"),
    path("passkeys/options/", views.passkey_options, name="passkey_options"),
    path("passkeys/enroll/", views.passkey_enroll, name="passkey_enroll"),
    path("passkeys/<int:passkey_id>/revoke/", views.passkey_revoke, name="passkey_revoke"),
]
