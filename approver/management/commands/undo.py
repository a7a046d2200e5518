from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from approver import services
from journal import roles
from journal.management.commands._runs import find_run


class Command(BaseCommand):
    help = ("Build a reversal plan for a run, from step N onwards, and queue its checks. Prints the plan's "
            "id, summary and URL.")

    def add_arguments(self, parser):
        parser.add_argument("run", help="The run's id (UUID).")
        parser.add_argument(
            "--from-step", type=int, required=True, help="Undo this step and everything after it."
        )
        parser.add_argument("--reason", default="", help="Why (shown to the approver).")
        parser.add_argument("--as", dest="username", required=True,
                            help="The on-call user asking (the plan records who asked).")

    def handle(self, run, from_step, reason, username, **options):
        user = get_user_model().objects.filter(username=username, is_active=True).first()
        if user is None or not roles.has_role(user, roles.ON_CALL):
            raise CommandError(
                f"{username!r} is not an active on-call user; only on-call staff ask for undo."
            )
        try:
            plan = services.request_plan(
                run=find_run(run), requested_by=user, reason=reason, from_step=from_step
            )
        except services.PlanRefused as refused:
            where = (
                f" Open plan: {settings.PUBLIC_URL}{services.plan_url(refused.open_plan)}"
                if refused.open_plan
                else ""
            )
            raise CommandError(refused.message + where) from None
        self.stdout.write(f"Plan {plan.public_id}")
        self.stdout.write(f"Undo {plan.compensate_count} action{'s' if plan.compensate_count != 1 else ''} "
                          f"{plan.selection_text}; {plan.cannot_undo_count} cannot be undone. Checks queued.")
        self.stdout.write(f"{settings.PUBLIC_URL}{services.plan_url(plan)}")
