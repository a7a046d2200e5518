"""Read-only JSON for reversal plans: a plan's content exactly as it is digested.

Same access rule as the pages (any of the three roles, signed in with a session). Recompute the digest
yourself: SHA-256 of the RFC 8785 (JCS) bytes of `content` equals `digest`.
"""

from django.http import JsonResponse
from django.views.decorators.http import require_GET

from journal.auth.access import READERS, require_role

from . import authority, planning, sentence
from .models import Plan, RecordLease
from .services import live_rest, plan_content


@require_GET
def plan_detail(request, plan_id):
    require_role(request, *READERS)
    plan = authority.visible_plan(request, plan_id, Plan.objects.for_page())
    content = plan_content(plan)
    # While checks run, the content moves with every answer; once the plan is ready, its digest is this one.
    return JsonResponse({
        "id": str(plan.public_id),
        "state": plan.state,
        "checks": {"total": plan.checks_total, "done": plan.checks_done},
        "digest": planning.digest(content),
        "content": content,
        # Plan the rest: the plan this one takes up, and where this one's rest went
        "restOf": str(plan.rest_of.public_id) if plan.rest_of_id else None,
        "rest": str(rest.public_id) if (rest := live_rest(plan)) else None,
        # What signing does, in the words the page and the approvers' email use (approver.sentence)
        "sentence": sentence.of_items(list(plan.items.select_related("step").order_by("position"))).as_json(
            sentence.lead(plan.state)) if plan.digest else None,
        # What each undo does, as the change it makes to the record (not signed: the content has the call)
        "undo": [{"item": item.position, "does": item.undo_words} for item in plan.items.filter(
            action="compensate").select_related("step").order_by("position")],
        # Its leases on the records it will change: held, or waiting in line behind the plan that holds it
        "leases": [_lease_json(lease) for lease in plan.leases.open().order_by("asked_at", "id")],
        # Who asked for each override and when (its reason is in the content, signed)
        "overrides": [
            {"item": item.position, "by": item.override_by.get_username() if item.override_by else None,
             "at": item.override_at.isoformat() if item.override_at else None, "reason": item.override_reason}
            for item in plan.items.exclude(override_reason="").select_related("override_by")
            .order_by("position")
        ],
    })


def _lease_json(lease: RecordLease) -> dict:
    holder = None if lease.is_held else RecordLease.objects.held().filter(
        server=lease.server, resource=lease.resource).select_related("plan").first()
    return {"server": lease.server, "resource": lease.resource, "held": lease.is_held,
            "since": lease.held_since.isoformat() if lease.held_since else None,
            "until": lease.until.isoformat() if lease.until else None, "askedAt": lease.asked_at.isoformat(),
            "heldBy": str(holder.plan.public_id) if holder else None}
