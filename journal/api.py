"""A read-only JSON API for runs and steps, described by an OpenAPI document at /api/openapi.json.

Same access rule as the pages (any of the three roles, signed in with a session); agents' bearer tokens
do not open it: an agent never reads other runs.
"""

from django.core.paginator import Paginator
from django.http import Http404, JsonResponse
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.views.decorators.http import require_GET

from . import services
from .auth import teams
from .auth.access import READERS, require_role, visible_run
from .models import Run, Step

PAGE_SIZE = 100


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
        "resultUrl": reverse("journal:api_step_result", args=[step.run.public_id, step.number])
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


def _page(request, queryset, render, url):
    page = Paginator(queryset, PAGE_SIZE).get_page(request.GET.get("page"))
    return {
        "items": [render(item) for item in page.object_list],
        "page": page.number,
        "pages": page.paginator.num_pages,
        "count": page.paginator.count,
        "next": f"{url}?page={page.next_page_number()}" if page.has_next() else None,
    }


@require_GET
def run_list(request):
    require_role(request, *READERS)
    runs = teams.visible_runs(request.user, Run.objects.for_list())
    return JsonResponse(_page(request, runs, run_json, reverse("journal:api_run_list")))


@require_GET
def run_detail(request, run_id):
    require_role(request, *READERS)
    return JsonResponse(run_json(visible_run(request, run_id, Run.objects.for_list())))


@require_GET
def step_list(request, run_id):
    require_role(request, *READERS)
    run = visible_run(request, run_id)
    url = reverse("journal:api_step_list", args=[run.public_id])
    return JsonResponse(_page(request, run.steps.select_related("run").order_by("number"), step_json, url))


@require_GET
def step_result(request, run_id, number):
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


def _schema() -> dict:
    string, integer, nullable_string = {"type": "string"}, {"type": "integer"}, {"type": ["string", "null"]}
    run = {
        "type": "object",
        "required": ["id", "agent", "state", "startedAt", "steps", "chain"],
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "agent": string,
            "onBehalfOf": nullable_string,
            "team": string,
            "state": {"enum": ["active", "failed", "imported"]},
            "importedFrom": nullable_string,
            "startedAt": {"type": "string", "format": "date-time"},
            "lastActivityAt": {"type": "string", "format": "date-time"},
            "steps": integer,
            "reversible": integer,
            "irreversible": integer,
            "unknown": integer,
            "failed": integer,
            "chain": {
                "type": "object",
                "properties": {"headSeq": integer, "headHash": string, "checkpointedSeq": integer},
            },
        },
    }
    step = {
        "type": "object",
        "required": ["number", "server", "tool", "status", "undo"],
        "properties": {
            "number": integer,
            "server": string,
            "tool": string,
            "arguments": {"type": "object"},
            "status": {"enum": ["pending", "held", "ok", "error", "undelivered", "cancelled"]},
            "isError": {"type": "boolean"},
            "result": {"type": ["object", "null"], "description": "null when kept in the run's record only"},
            "resultStorage": {"enum": ["inline", "journal", "dropped", None]},
            "resultSize": {"type": ["integer", "null"]},
            "resultSha256": nullable_string,
            "resultUrl": nullable_string,
            "error": nullable_string,
            "failureClass": nullable_string,
            "startedAt": {"type": "string", "format": "date-time"},
            "finishedAt": nullable_string,
            "durationMs": {"type": ["number", "null"]},
            "undo": {
                "type": "object",
                "properties": {
                    "kind": {"enum": ["compensate", "none", "unknown", "read_only"]},
                    "source": string,
                    "declaration": {"type": "object"},
                    "compensationArguments": {"type": ["object", "null"]},
                    "problems": {"type": "array", "items": string},
                    "undoBy": nullable_string,
                },
            },
            "effect": {
                "type": "object",
                "properties": {"summary": string, "resource": string, "version": string},
            },
            "compensationToken": nullable_string,
            "earlierState": {"type": ["object", "null"], "description": (
                "What an admin's undo recipe read of the record just before the call (tool, arguments, "
                "version, structured) and just after it (left), or why it could not (error, problem).")},
            "receipt": {"type": ["object", "null"]},
            "receiptVerified": {"type": ["boolean", "null"]},
        },
    }

    def paged(item_ref):
        return {"type": "object", "properties": {
            "items": {"type": "array", "items": {"$ref": item_ref}}, "page": integer, "pages": integer,
            "count": integer, "next": nullable_string}}

    run_id = {
        "name": "run_id",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "format": "uuid"},
    }
    page = {"name": "page", "in": "query", "required": False, "schema": integer}

    def ok(ref):
        return {"200": {"description": "OK", "content": {"application/json": {"schema": ref}}},
                "403": {"description": "Signed in without a role that may read runs"},
                "404": {"description": "No such run"}}

    return {
        "openapi": "3.1.0",
        "info": {"title": "Agent undo: runs and steps", "version": "1"},
        "components": {
            "schemas": {
                "Run": run,
                "Step": step,
                "RunPage": paged("#/components/schemas/Run"),
                "StepPage": paged("#/components/schemas/Step"),
            },
            "securitySchemes": {"session": {"type": "apiKey", "in": "cookie", "name": "sessionid"}},
        },
        "security": [{"session": []}],
        "paths": {
            "/api/runs/": {
                "get": {
                    "summary": "Runs, newest first",
                    "parameters": [page],
                    "responses": ok({"$ref": "#/components/schemas/RunPage"}),
                }
            },
            "/api/runs/{run_id}/": {
                "get": {
                    "summary": "One run",
                    "parameters": [run_id],
                    "responses": ok({"$ref": "#/components/schemas/Run"}),
                }
            },
            "/api/runs/{run_id}/steps/": {
                "get": {
                    "summary": "A run's steps in order",
                    "parameters": [run_id, page],
                    "responses": ok({"$ref": "#/components/schemas/StepPage"}),
                }
            },
            "/api/runs/{run_id}/steps/{number}/result": {
                "get": {
                    "summary": "A step's whole result, from the run's record",
                    "parameters": [
                        run_id,
                        {"name": "number", "in": "path", "required": True, "schema": integer},
                    ],
                    "responses": ok({"type": "object"}),
                }
            },
        },
    }


@require_GET
def openapi(request):
    require_role(request, *READERS)
    return JsonResponse(_schema())
