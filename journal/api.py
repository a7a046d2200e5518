"""The API's runs and steps (read-only): a router of the one API (`approver.web_api`), whose OpenAPI document
at /api/openapi.json is generated from these functions and schemas.

Same access rule as the pages (any of the three roles, within their teams), signed in with a session or a
personal API token; agents' bearer tokens do not open it: an agent never reads other runs.
"""

from typing import Annotated, Any, Literal

from django.core.paginator import Paginator
from django.http import Http404, JsonResponse
from django.shortcuts import get_object_or_404
from django.urls import reverse
from ninja import Field, Router, Schema

from . import services
from .auth import teams
from .auth.access import READERS, require_role, visible_run
from .models import Run, Step

PAGE_SIZE = 100
# Moments as the record writes them (ISO 8601, to the microsecond), not re-encoded on the way out.
Moment = Annotated[str, Field(json_schema_extra={"format": "date-time"})]
PublicId = Annotated[str, Field(json_schema_extra={"format": "uuid"})]

router = Router(tags=["Runs and steps"])


def run_json(run: Run) -> dict:
    return {
        "id": str(run.public_id),
        "agent": run.agent_name,
        "onBehalfOf": run.agent.on_behalf_of.get_username() if run.agent_id else None,
        "team": run.team.name,  # whose people see it, undo it and approve
        "state": run.state,
        # Where an imported run was recorded (null for this Recorder's own runs and ChronoMCP imports).
        "importedFrom": run.imported_from or None,
        "startedAt": run.started_at.isoformat(),
        "lastActivityAt": run.last_activity_at.isoformat(),
        "steps": run.step_count,
        "reversible": run.reversible_count,
        "irreversible": run.irreversible_count,
        "unknown": run.unknown_count,
        "failed": run.failed_count,
        "chain": {
            "headSeq": run.head_seq,
            "headHash": run.head_hash,
            "checkpointedSeq": run.checkpointed_seq,
        },
    }


def step_json(step: Step) -> dict:
    return {
        "number": step.number,
        "server": step.server_name,
        "tool": step.tool,
        "arguments": step.arguments,
        "status": step.status,
        "isError": step.is_error,
        "result": step.result,
        "resultStorage": step.result_storage or None,
        "resultSize": step.result_size,
        "resultSha256": step.result_sha256 or None,
        "resultUrl": reverse("api:step_result", args=[step.run.public_id, step.number])
        if step.result_storage in (Step.ResultStorage.INLINE, Step.ResultStorage.JOURNAL)
        else None,
        "error": step.error_message or None,
        "failureClass": step.failure_class or None,
        "startedAt": step.started_at.isoformat(),
        "finishedAt": step.finished_at.isoformat() if step.finished_at else None,
        "durationMs": step.duration_ms,
        "undo": {
            "kind": step.reversibility,
            "source": step.declaration_source,
            "declaration": step.declaration,
            "compensationArguments": step.compensation_arguments,
            "problems": step.undo_problems,
            "undoBy": step.undo_by.isoformat() if step.undo_by else None,
        },
        "effect": {
            "summary": step.effect_summary,
            "resource": step.effect_resource,
            "version": step.effect_version,
            **({"fields": step.effect_fields} if step.effect_fields else {}),
        },
        "compensationToken": step.compensation_token or None,
        "earlierState": step.earlier_state,  # an admin's recipe read the record before (and after) the call
        "receipt": step.receipt,
        "receiptVerified": step.receipt_verified,
    }


class Chain(Schema):
    headSeq: int
    headHash: str
    checkpointedSeq: int


class RunOut(Schema):
    id: PublicId
    agent: str
    onBehalfOf: str | None
    team: str = Field(description="Whose people see the run, undo it and approve.")
    state: Literal["active", "failed", "imported"]
    importedFrom: str | None = Field(description="Where an imported run was recorded.")
    startedAt: Moment
    lastActivityAt: Moment
    steps: int
    reversible: int
    irreversible: int
    unknown: int
    failed: int
    chain: Chain


class StepUndo(Schema):
    kind: Literal["compensate", "none", "unknown", "read_only"]
    source: str
    declaration: Any
    compensationArguments: Any = Field(description="The arguments of its undo call, when it has one.")
    problems: list[str]
    undoBy: Moment | None


class StepEffect(Schema):
    summary: str
    resource: str
    version: str
    fields: Any = Field(None, description="Field by field, before and after, where its server said.")


class StepOut(Schema):
    number: int
    server: str
    tool: str
    arguments: Any
    status: Literal["pending", "held", "ok", "error", "undelivered", "cancelled"]
    isError: bool
    result: Any = Field(description="null when kept in the run's record only: read it at resultUrl")
    resultStorage: Literal["inline", "journal", "dropped"] | None
    resultSize: int | None
    resultSha256: str | None
    resultUrl: str | None
    error: str | None
    failureClass: str | None
    startedAt: Moment
    finishedAt: Moment | None
    durationMs: float | None
    undo: StepUndo
    effect: StepEffect
    compensationToken: str | None
    earlierState: Any = Field(description=(
        "What an admin's undo recipe read of the record just before the call (tool, arguments, version, "
        "structured) and just after it (left), or why it could not (error, problem)."))
    receipt: Any
    receiptVerified: bool | None


class RunPage(Schema):
    items: list[RunOut]
    page: int
    pages: int
    count: int
    next: str | None


class StepPage(Schema):
    items: list[StepOut]
    page: int
    pages: int
    count: int
    next: str | None


def page_of(queryset, render, url: str, page: int) -> dict[str, Any]:
    """One page of `queryset` (PAGE_SIZE a page), each item as `render` makes it, and where the next is."""
    shown = Paginator(queryset, PAGE_SIZE).get_page(page)
    return {
        "items": [render(item) for item in shown.object_list],
        "page": shown.number,
        "pages": shown.paginator.num_pages,
        "count": shown.paginator.count,
        "next": f"{url}?page={shown.next_page_number()}" if shown.has_next() else None,
    }


@router.get("/runs/", response=RunPage, url_name="run_list", summary="Runs, newest first")
def run_list(request, page: int = 1):
    require_role(request, *READERS)
    runs = teams.visible_runs(request.user, Run.objects.for_list())
    return page_of(runs, run_json, reverse("api:run_list"), page)


@router.get("/runs/{uuid:run_id}/", response=RunOut, url_name="run_detail", summary="One run")
def run_detail(request, run_id):
    require_role(request, *READERS)
    return run_json(visible_run(request, run_id, Run.objects.for_list()))


@router.get("/runs/{uuid:run_id}/steps/", response=StepPage, url_name="step_list",
            summary="A run's steps in order")
def step_list(request, run_id, page: int = 1):
    require_role(request, *READERS)
    run = visible_run(request, run_id)
    url = reverse("api:step_list", args=[run.public_id])
    return page_of(run.steps.select_related("run").order_by("number"), step_json, url, page)


@router.get("/runs/{uuid:run_id}/steps/{int:number}/result", response=dict[str, Any], url_name="step_result",
            summary="A step's whole result, from the run's record")
def step_result(request, run_id, number: int):
    """A step's whole result, as the server sent it, from the run's record (where a large one is kept)."""
    require_role(request, *READERS)
    run = visible_run(request, run_id)
    step = get_object_or_404(Step, run=run, number=number)
    result = services.step_result(step)
    if result is None:
        raise Http404("This step has no result in the run's record.")
    response = JsonResponse(result)
    response["Content-Disposition"] = (
        f'attachment; filename="run-{run.public_id}-step-{step.number}-result.json"'
    )
    return response
