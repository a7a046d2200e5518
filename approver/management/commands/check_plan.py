import uuid

from django.core.management.base import BaseCommand, CommandError

from approver import services
from approver.models import Plan, PlanItem


class Command(BaseCommand):
    help = "Check a plan's items against their tool servers now (in this process) and print each result."

    def add_arguments(self, parser):
        parser.add_argument("plan", help="The plan's id (UUID).")

    def handle(self, plan, **options):
        try:
            found = (
                Plan.objects.filter(public_id=uuid.UUID(plan)).select_related("run", "requested_by").first()
            )
        except ValueError:
            raise CommandError(f"{plan!r} is not a plan id (a UUID, as shown in the plan's URL).") from None
        if found is None:
            raise CommandError(f"No plan {plan}.")
        if found.state != Plan.State.CHECKING and not services.queue_checks(plan=found, ring=False):
            raise CommandError(f"The plan is {found.get_state_display().lower()}; it cannot be checked now.")
        found.refresh_from_db()
        checked = services.run_checks(plan=found, check_round=found.check_round)
        if checked is None:
            raise CommandError("Another check of this plan started meanwhile; see the plan page.")
        for item in services.items_for_page(checked):
            if item.action != PlanItem.Action.COMPENSATE:
                continue
            detail = item.check_detail or {}
            words = detail.get("wouldDo") or detail.get("message") or ""
            if item.check_status == PlanItem.Check.CONFLICT:
                current = detail.get("current") or {}
                words = (f"changed since: agent left {item.if_version}, now {current.get('version')}"
                         f" by {current.get('changedBy') or 'someone'} at {current.get('changedAt') or '?'}")
            self.stdout.write(
                f"{item.position}. step {item.step.number} {item.step.server_name}__{item.step.tool}: "
                f"{item.check_status} {words}".rstrip()
            )
        self.stdout.write(f"Plan {checked.get_state_display().lower()}; digest {checked.digest}")
