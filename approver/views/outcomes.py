"""Outcomes nobody knows: a human looks, then settles them or tries again."""

from django.contrib import messages
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from journal.auth.access import require_role

from .. import authority, services


def _settling(request, plan_id, position: int, action, done: str):
    plan = authority.visible_plan(request, plan_id)
    try:
        answer = action(plan=plan, position=position, by=request.user)
    except services.NotSettled as refused:
        messages.error(request, refused.message)
    else:
        messages.success(
            request, done.format(answer=answer.get("message", "") if isinstance(answer, dict) else "")
        )
    return redirect(f"{services.plan_url(plan)}#item-{position}")


@require_POST
def check_outcome(request, plan_id, position):
    """Ask the tool server, changing nothing, where a compensation whose outcome is unknown stands."""
    require_role(request, *authority.MAY_SETTLE)
    return _settling(request, plan_id, position, services.check_unknown, "The server's answer: {answer}")


@require_POST
def settle_outcome(request, plan_id, position):
    """A human's word, after looking: the compensation took effect, or it did not."""
    require_role(request, *authority.MAY_SETTLE)
    settlement = request.POST.get("settlement", "")

    def settle(**kwargs):
        return services.settle_unknown(settlement=settlement, **kwargs)

    return _settling(request, plan_id, position, settle, "Recorded. The report is counted again.")


@require_POST
def retry_outcome(request, plan_id, position):
    """Run the compensation again with the same idempotency key: an approver's decision, after looking."""
    require_role(request, *authority.MAY_CONTROL)
    return _settling(request, plan_id, position, services.retry_unknown,
                     "Trying again with the same idempotency key; the approvals were checked first.")
