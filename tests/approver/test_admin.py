"""The admin's approval rules go through their one writer, and every change is in the signed change log."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.urls import reverse

from approver import services
from approver.models import ApprovalRules, PolicyChange

pytestmark = pytest.mark.django_db


def test_an_admin_changes_the_approval_rules_and_the_change_log_says_who_before_and_after(client, admin_user):
    root = User.objects.create_superuser("root", password="root-password-1")
    client.force_login(root)
    response = client.post(reverse("admin:approver_approvalrules_add"), {
        "approver_role": "approver", "quorum": 1, "valid_for": "12:00:00", "separation_of_duties": "on"})
    assert response.status_code == 302
    rules = ApprovalRules.current()
    assert (rules.quorum, rules.valid_for) == (1, timedelta(hours=12))
    change = PolicyChange.objects.get()
    assert change.event == "rules_changed" and change.data["by"] == "root"
    assert change.data["before"]["quorum"] == 2 and change.data["after"] == {
        "name": "Approval rules", "approverRole": "approver", "quorum": 1, "validForSeconds": 43200,
        "separationOfDuties": True}
    assert services.verify_policy_log().ok


def test_saving_the_rules_unchanged_logs_nothing_and_a_bad_value_saves_nothing(admin_user):
    services.save_approval_rules(rules=ApprovalRules(quorum=3), by=admin_user)
    services.save_approval_rules(rules=ApprovalRules(quorum=3), by=admin_user)
    assert PolicyChange.objects.count() == 1
    with pytest.raises(ValidationError):
        services.save_approval_rules(rules=ApprovalRules(quorum=0), by=admin_user)
    assert ApprovalRules.current().quorum == 3 and PolicyChange.objects.count() == 1
