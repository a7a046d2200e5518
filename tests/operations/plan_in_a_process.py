"""A plan asked for and signed in a process of its own, as the web app would (the test's own process cannot
turn tracing on without changing every later test): `python -m tests.operations.plan_in_a_process RUN_ID`
asks for olivia's plan from step 1 of the run as the run page does, waits for the worker to draft and check
it, and has ana and bo sign it with passkeys of their own; it prints the plan's public id."""

import os
import sys
import time

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "approver.settings")
django.setup()

from django.conf import settings  # noqa: E402 - needs Django set up first
from django.contrib.auth.models import User  # noqa: E402

from approver import services  # noqa: E402
from approver.models import Plan  # noqa: E402
from journal.models import Run  # noqa: E402
from tests.approver.services.test_approvals import ORIGIN, approve, enrolled  # noqa: E402


def main(run_id: int) -> None:
    settings.WEBAUTHN_RP_ID, settings.WEBAUTHN_ORIGINS = "localhost", [ORIGIN]
    run = Run.objects.get(pk=run_id)
    plan = services.ask_for_plan(run=run, requested_by=User.objects.get(username="olivia"),
                                 reason="wrong customer", from_step=1)  # as the run page asks
    deadline = time.monotonic() + 60
    while not Plan.objects.filter(pk=plan.pk, state="ready").exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"the plan was not checked: {Plan.objects.get(pk=plan.pk).state}")
        time.sleep(0.2)
    plan.refresh_from_db()
    for name in ("ana", "bo"):
        user = User.objects.get(username=name)
        approve(plan, user, enrolled(user), choices={})
    print(plan.public_id)


if __name__ == "__main__":
    main(int(sys.argv[1]))
