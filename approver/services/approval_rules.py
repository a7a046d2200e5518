"""The approval rules (who may sign, how many must, for how long, separation of duties): the one writer of
their rows (the shared one, and a team's own), which records every change in the policies' change log (who,
when, before, after), as a policy change is."""

from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from ..models import ApprovalRules
from .policies import log_change

RULES_CHANGED = "rules_changed"


def rules_record(rules: ApprovalRules) -> dict[str, Any]:
    """The rules as the change log keeps them."""
    return {
        "name": f"Approval rules of team {rules.team.name}" if rules.team_id else "Approval rules",
        "approverRole": rules.approver_role,
        "quorum": rules.quorum,
        "validForSeconds": int(rules.valid_for.total_seconds()),
        "separationOfDuties": rules.separation_of_duties,
    }


def save_approval_rules(*, rules: ApprovalRules, by, now: datetime | None = None) -> ApprovalRules:
    """Keep the rules of `rules.team` (blank: the shared ones) after Django's validation, and log the change;
    a save that changes nothing logs nothing. A team has one row of rules at most, updated in place. Takes
    effect at once: every sign-off and execution reads the rules again."""
    now = now or timezone.now()
    rules.full_clean(validate_unique=False)  # the team's row is updated, never a second made
    with transaction.atomic():
        saved = (ApprovalRules.objects.select_for_update().filter(team=rules.team_id).order_by("pk")
                 .first())
        rules.pk = saved.pk if saved else None
        before = rules_record(saved or ApprovalRules(team=rules.team))
        after = rules_record(rules)
        rules.save()
        if saved is None or before != after:
            log_change(RULES_CHANGED, by=by, now=now, before=before, after=after)
    return rules
