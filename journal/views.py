from django.conf import settings
from django.contrib import messages
from django.core.paginator import Paginator
from django.db.models import Count, JSONField, OuterRef, Prefetch, Subquery
from django.db.models.fields.json import KeyTransform
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_GET, require_POST

from . import ports, services, tally
from .auth import oauth, roles, teams
from .auth.access import READERS, LoginRequired, require_role, visible_agent, visible_agents, visible_run
from .forms import RunFilterForm
from .models import Run, Step, StepDependency
from .services.runs import IDLE_KEY
from .undo.declarations import HATP_KEY

RUNS_PER_PAGE = 25
RUN_NAME_KEY = "runName"  # what an agent may call its run, in `_meta["hatp/journal"]`
STEPS_PER_PAGE = 200


@require_GET
def run_list(request):
    require_role(request, *READERS)
    form = RunFilterForm(request.GET or None)
    mine = teams.visible_runs(request.user, Run.objects.for_list())
    runs = form.filter(mine) if form.is_bound else mine
    page = Paginator(runs.annotate(**_gist()), RUNS_PER_PAGE).get_page(request.GET.get("page"))
    page.object_list = list(page.object_list)
    stories = ports.story().runs(page.object_list)
    for run in page.object_list:
        run.story = stories.get(run.pk, {})
        run.named = run.named if isinstance(run.named, str) else ""  # the agent may send anything there
    query = request.GET.copy()
    query.pop("page", None)
    template = "journal/run_list.html#runs" if request.htmx else "journal/run_list.html"
    return render(request, template, {"form": form, "page": page, "query": query.urlencode()})


def _gist() -> dict:
    """What tells runs apart in the list: the name the agent gave the run (`_meta["hatp/journal"]["runName"]`
    on its first call) and the first change it made."""
    steps = Step.objects.filter(run=OuterRef("pk"))
    return {
        "named": Subquery(steps.filter(number=1).annotate(
            name=KeyTransform(RUN_NAME_KEY, KeyTransform(HATP_KEY, "request_meta"))).values("name")[:1],
            output_field=JSONField()),
        "first_change": Subquery(
            steps.exclude(effect_summary="").order_by("number").values("effect_summary")[:1]),
    }


@require_GET
def run_detail(request, run_id):
    require_role(request, *READERS)
    run = visible_run(request, run_id, Run.objects.for_list())
    steps = (
        Step.objects.filter(run=run)
        .order_by("number")
        .prefetch_related(
            Prefetch(
                "dependencies",
                queryset=StepDependency.objects.select_related("depends_on").only(
                    "step_id", "rule", "pointers", "depends_on__number"
                ),
            )
        )
        .only(
            "number",
            "server_name",
            "tool",
            "status",
            "is_error",
            "error_message",
            "failure_class",
            "started_at",
            "duration_ms",
            "declaration",
            "declaration_source",
            "reversibility",
            "undo_problems",
            "effect_summary",
            "effect_resource",
            "effect_version",
            "undo_by",
            "receipt_verified",
            "receipt_problem",
            "run_id",
            "arguments",
            "compensation_arguments",
            "policy_decision",
            "result_storage",
            "result_size",
            "result_sha256",
            "recovery",
            "earlier_state",
            "may_have_acted",
            "finished_at",
            "task_id",
            "task_until",
            "held_call",
        )
    )
    # "Changes and failures only": every step that changed something or may have, and every one that failed.
    only_changes = request.GET.get("only") == "changes"
    if only_changes:
        steps = steps.exclude(reversibility=Step.Reversibility.READ_ONLY, status=Step.Status.OK,
                              is_error=False)
    page = Paginator(steps, STEPS_PER_PAGE).get_page(request.GET.get("page"))
    page.object_list = list(page.object_list)
    stories = ports.story().steps(page.object_list)
    for step in page.object_list:
        step.story = stories.get(step.pk, {})
        step.offers_undo = not (step.story.get("undone") or step.story.get("inPlan"))
        # As the step is now: undone by a plan; a held call approved and sent, or denied.
        step.badge_now = ("undone", "Undone") if step.story.get("undone") else step.badge
        step.decided_now = _decided_now(step)
    return render(
        request,
        "journal/run_detail.html",
        {
            "run": run,
            "page": page,
            "now": timezone.now(),
            "idle_minutes": settings.RECORDER_RUN_IDLE_SECONDS // 60,
            "by_idle_rule": not run.key or run.key.startswith(IDLE_KEY),
            "programs": _programs(run),
            "only_changes": only_changes,
            **_header(run),
        },
    )


def _decided_now(step: Step) -> tuple[str, str]:
    """(css class, words) for what the policies decided of a step, as it stands now: "Held for approval"
    while it waits, "Held for approval, then approved and sent" once it went out."""
    decision = (step.policy_decision or {}).get("decision")
    if decision in ("allow", "deny"):
        return f"decision-{decision}", "Allowed" if decision == "allow" else "Denied"
    held = step.story.get("held") or {}
    if step.status != Step.Status.HELD and held.get("sent"):
        return "decision-settled", "Held for approval, then approved and sent"
    if step.status != Step.Status.HELD and held.get("denied"):
        return "decision-settled", "Held for approval, then denied"
    return "decision-ask", "Held for approval"


def _programs(run: Run) -> list[str]:
    """The client programs the run's calls came from, as each named itself, when there are several: one
    run of two programs is likely two tasks, and undoing "from step N" would undo both."""
    named = sorted(set(run.entries.filter(event="call", data__has_key="client")
                       .values_list("data__client", flat=True)))
    return named if len(named) > 1 else []


def _header(run: Run) -> dict:
    """What the run page's header says of the whole run: its steps counted by kind, every step once, the
    plan it is the undo calls of, if it is one, and whether its steps may be undone from here at all."""
    groups = (Step.objects.filter(run=run).order_by()
              .values_list("status", "reversibility", "failure_class", "may_have_acted")
              .annotate(n=Count("id")))
    story = ports.story().run(run)
    return {"tally": tally.header(groups), "story": story,
            # Imported runs are undone where they ran, and a plan's undo calls are part of that plan.
            "may_undo": run.state != Run.State.IMPORTED and not story.get("compensates")}


@require_GET
def run_verify(request, run_id):
    """Recompute the run's hash chain and check its signed checkpoints, as `manage.py verify_run` does."""
    require_role(request, *READERS)
    run = visible_run(request, run_id, Run.objects.for_list())
    verdict = services.verify_run(run=run)
    if request.htmx:
        return render(request, "journal/run_detail.html#verdict", {"run": run, "verdict": verdict})
    steps = Step.objects.none()
    page = Paginator(steps, STEPS_PER_PAGE).get_page(1)
    return render(request, "journal/run_detail.html", {"run": run, "page": page, "now": timezone.now(),
                                                        "verdict": verdict, "verdict_only": True,
                                                        **_header(run)})


@require_POST
def run_end(request, run_id):
    """End a run the idle rule keeps extending: the agent's next call without a runId starts a new run."""
    require_role(request, roles.ON_CALL, roles.ADMIN)
    run = visible_run(request, run_id)
    try:
        services.end_run(run_id=run.pk, by=request.user.get_username(), now=timezone.now())
    except services.RunRefused as refused:
        messages.error(request, refused.message)
    else:
        messages.success(request, "Run ended: the agent's next call starts a new run.")
    return redirect("journal:run_detail", run_id=run.public_id)


@require_POST
def run_release(request, run_id):
    """Let the agent's calls into a run a failed call halted (a saga policy) again; the plan goes on."""
    require_role(request, roles.ON_CALL, roles.ADMIN)
    run = visible_run(request, run_id)
    if services.release_run(run_id=run.pk, by=request.user.get_username(), why="released by a person",
                            now=timezone.now()):
        messages.success(
            request, "Run released: the agent's calls in it go through again. The undo plan goes on."
        )
    else:
        messages.info(request, "This run was not halted.")
    return redirect("journal:run_detail", run_id=run.public_id)


@require_GET
def agent_list(request):
    if not request.user.is_authenticated:
        raise LoginRequired(request)
    agents = visible_agents(request.user).annotate(clients=Count("client_authorizations"))
    return render(request, "journal/agent_list.html", {"agents": agents})


@require_GET
def agent_detail(request, name):
    agent = visible_agent(request, name)
    authorizations = agent.client_authorizations.select_related("application", "user")
    runs = Run.objects.for_list().filter(agent=agent)[:10]
    since = _moment(request.GET.get("since", ""))  # the run page's link says since when
    return render(request, "journal/agent_detail.html", {
        "agent": agent, "authorizations": authorizations, "runs": runs,
        "may_manage": oauth.may_manage(request.user, agent),
        "may_undo": roles.has_role(request.user, roles.ON_CALL), "since": since,
        # The person an agent acts for may have no role that reads runs: no links that answer "Not allowed".
        "may_read_runs": any(roles.has_role(request.user, role) for role in READERS),
        "time_zone": timezone.get_current_timezone_name()})


def _moment(text: str) -> str:
    """A moment given in a link, as a datetime-local field shows it ("" when it is not one)."""
    try:
        moment = parse_datetime(text[:40])
    except ValueError:
        return ""
    if moment is not None and timezone.is_aware(moment):
        moment = timezone.localtime(moment)  # in the viewer's zone, which the form reads it in
    return moment.strftime("%Y-%m-%dT%H:%M:%S") if moment else ""
