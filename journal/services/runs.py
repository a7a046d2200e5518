"""Finding an agent's runs by agent and time, and ending a run the idle rule would keep extending.

An agent on the stateless 2026-07-28 protocol has no session: its calls join the run its `runId` names
(`_meta["hatp/journal"]["runId"]`), else its latest run without a key that was active within
RECORDER_RUN_IDLE_SECONDS (the idle rule). When the idle rule put two tasks in one run, an on-call user ends
it (`end_run`): the agent's next call without a runId starts a new run. What already happened stays where it
is, since the chain is append-only; the ending is an entry on it.
"""

from datetime import datetime

from django.db import transaction
from django.db.models import QuerySet

from ..errors import Refused
from ..models import Agent, Run
from .record import append_entry, locked_run_by_id, save_moving

IDLE_KEY = "idle:"  # runs by the idle rule, one client program's apart from another's (`mcp.context.run_key`)


class RunRefused(Refused):
    pass


def runs_matching(
    runs: QuerySet,
    *,
    agent: Agent | None = None,
    state: str = "",
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet:
    """The runs of `agent` (any if None), in `state`, that were active at some time between `since` and
    `until` (a run is active from its start to its last activity)."""
    if agent is not None:
        runs = runs.filter(agent=agent)
    if state:
        runs = runs.filter(state=state)
    if since is not None:
        runs = runs.filter(last_activity_at__gte=since)
    if until is not None:
        runs = runs.filter(started_at__lte=until)
    return runs


def end_run(*, run_id: int, by: str, now: datetime) -> None:
    """End a run the idle rule found (one without a runId or session): the agent's next call starts anew."""
    with transaction.atomic():
        run = locked_run_by_id(run_id)
        if run is None:
            raise RunRefused("No such run.")
        if run.state == Run.State.IMPORTED:  # another Recorder's bundle or a ChronoMCP log: never written to
            raise RunRefused("This run was imported: nothing here changes it.")
        if run.key and not run.key.startswith(IDLE_KEY):
            raise RunRefused(
                "This run is grouped by the agent's own runId or session: the agent decides where it "
                "ends, by sending another runId or opening a new session."
            )
        if run.ended_at is not None:
            raise RunRefused("This run was already ended; the agent's later calls are in a new run.")
        append_entry(
            run=run,
            event="ended",
            data={"by": by, "reason": "ended by a person: the agent's next call starts a new run"},
            now=now,
        )
        save_moving(run, now=None)
        Run.objects.filter(pk=run_id).update(ended_at=now)


def halt_run(*, run_id: int, plan: str, reason: str, now: datetime) -> None:
    """Stop a run after a failed call (a saga policy), and its agent with it: the agent's further calls, in
    this run or any other (a new runId must not sidestep the halt), are refused while `plan` (the plan that
    undoes the task) is open, until it ends or a person releases the run."""
    with transaction.atomic():
        run = locked_run_by_id(run_id)
        append_entry(run=run, event="halted", now=now, data={"plan": plan, "reason": reason, "agent": True})
        save_moving(run, now=None)
        Run.objects.filter(pk=run_id).update(halted_by_plan=plan, halted_reason=reason)
        # An agent halted by an earlier plan stays halted by it; this run's halt takes over when that ends.
        Agent.objects.filter(pk=run.agent_id, halted_by_plan="").update(halted_by_plan=plan,
                                                                         halted_reason=reason)


def release_run(*, run_id: int, by: str, why: str, now: datetime) -> bool:
    """Let the agent's calls into a halted run again: a person released it, or its plan ended. False if the
    run was not halted."""
    with transaction.atomic():
        run = locked_run_by_id(run_id)
        if run is None:
            raise RunRefused("No such run.")
        if not run.halted_by_plan:
            return False
        release(run, by=by, why=why, now=now)
        save_moving(run, now=None)
    return True


def release(run: Run, *, by: str, why: str, now: datetime) -> None:
    """The release itself, on a run the caller holds locked (and saves). The agent is released with it, or,
    if another of its runs is still halted, stays halted by that one's plan."""
    append_entry(run=run, event="released", now=now, data={"plan": run.halted_by_plan, "by": by, "why": why})
    Run.objects.filter(pk=run.pk).update(halted_by_plan="", halted_reason="")
    release_agent(agent_id=run.agent_id, plan=run.halted_by_plan)
    run.halted_by_plan = ""


def release_agent(*, agent_id: int, plan: str) -> None:
    """The agent's halt by `plan` ends (the plan ended, or its run was released). If another of its runs is
    still halted, the agent stays halted by that run's plan (which is looked at again on its next call)."""
    still = (Run.objects.filter(agent_id=agent_id).exclude(halted_by_plan__in=("", plan)).order_by("pk")
             .values("halted_by_plan", "halted_reason").first())
    Agent.objects.filter(pk=agent_id, halted_by_plan=plan).update(
        **(still or {"halted_by_plan": "", "halted_reason": ""}))
