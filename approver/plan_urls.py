from django.urls import path

from .views import held_calls, outcomes, passkeys, plans, policies, servers, sign_off, tokens

app_name = "approver"

urlpatterns = [
    path("runs/<uuid:run_id>/undo/", plans.request_undo, name="request_undo"),
    path("agents/<slug:name>/undo/", plans.undo_since, name="undo_since"),
    path("plans/", plans.plan_list, name="plan_list"),
    path("plans/<uuid:plan_id>/", plans.plan_detail, name="plan_detail"),
    path("plans/<uuid:plan_id>/check/", plans.check_again, name="check_again"),
    path("plans/<uuid:plan_id>/cancel/", plans.cancel, name="cancel"),
    path("plans/<uuid:plan_id>/abort/", plans.abort, name="abort"),
    path("plans/<uuid:plan_id>/pause/", plans.pause, name="pause"),
    path("plans/<uuid:plan_id>/resume/", plans.resume, name="resume"),
    path("plans/<uuid:plan_id>/rest/", plans.plan_rest, name="plan_rest"),
    path("plans/<uuid:plan_id>/leases/<int:lease_id>/break/", plans.break_lease, name="break_lease"),
    path("plans/<uuid:plan_id>/items/<int:position>/check/", outcomes.check_outcome, name="check_outcome"),
    path("plans/<uuid:plan_id>/items/<int:position>/settle/", outcomes.settle_outcome, name="settle_outcome"),
    path("plans/<uuid:plan_id>/items/<int:position>/retry/", outcomes.retry_outcome, name="retry_outcome"),
    path("plans/<uuid:plan_id>/sign/", sign_off.sign_begin, name="sign_begin"),
    path("plans/<uuid:plan_id>/sign/complete/", sign_off.sign_complete, name="sign_complete"),
    path("policies/", policies.policy_list, name="policy_list"),
    path("policies/new/", policies.policy_edit, name="policy_new"),
    path("policies/<int:policy_id>/", policies.policy_edit, name="policy_edit"),
    path("policies/<int:policy_id>/delete/", policies.policy_delete, name="policy_delete"),
    path("servers/", servers.server_list, name="server_list"),
    path("servers/<int:server_id>/", servers.server_detail, name="server_detail"),
    path("servers/<int:server_id>/pack/", servers.server_pack, name="server_pack"),
    path("servers/<int:server_id>/recipe/", servers.server_recipe, name="server_recipe"),
    path("servers/<int:server_id>/recipe/remove/", servers.server_recipe_remove, name="server_recipe_remove"),
    path("actions/", held_calls.action_list, name="action_list"),
    path("actions/<uuid:action_id>/", held_calls.action_detail, name="action_detail"),
    path("actions/<uuid:action_id>/sign/", held_calls.action_sign_begin, name="action_sign_begin"),
    path(
        "actions/<uuid:action_id>/sign/complete/",
        held_calls.action_sign_complete,
        name="action_sign_complete",
    ),
    path("passkeys/", passkeys.passkey_list, name="passkey_list"),
    path("passkeys/options/", passkeys.passkey_options, name="passkey_options"),
    path("passkeys/enroll/", passkeys.passkey_enroll, name="passkey_enroll"),
    path("passkeys/<int:passkey_id>/revoke/", passkeys.passkey_revoke, name="passkey_revoke"),
    path("tokens/", tokens.token_list, name="token_list"),
    path("tokens/<int:token_id>/revoke/", tokens.token_revoke, name="token_revoke"),
]
