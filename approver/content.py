"""Reads of a plan: its content exactly as it is digested and signed, its items as the plan page shows them,
and where it lives. No writes."""

import contextlib
import os
from pathlib import Path
from typing import Any

from django.conf import settings
from django.urls import reverse

from . import planning
from .models import Plan, PlanItem

# What the content reads of each item and its step: plain values, one query, whatever the plan's size.
_CONTENT_FIELDS = (
    "position",
    "action",
    "rule",
    "pulled_in_by",
    "tool",
    "arguments",
    "if_version",
    "then",
    "idempotency_key",
    "needs_human",
    "via",
    "side_effect",
    "cost",
    "undo_by",
    "reason",
    "remedy",
    "check_status",
    "check_detail",
    "conflict_choice",
    "override_reason",
    "step__number",
    "step__run__public_id",
    "step__server_name",
    "step__tool",
    "step__effect_summary",
    "step__effect_resource",
    "step__effect_version",
    "step__effect_fingerprint",
)


def content_rows(plan: Plan) -> list[dict[str, Any]]:
    return list(plan.items.order_by("position").values(*_CONTENT_FIELDS))


def plan_content(plan: Plan, rows: list[dict[str, Any]] | None = None, choices: dict[str, str] | None = None,
                 overrides: dict[str, str] | None = None) -> dict[str, Any]:
    """The plan's content, exactly as it is digested (`rows` from `content_rows`, read if not given), or as
    it would be with these conflict `choices` (item position as text -> choice) and the reasons for their
    overwrites (`overrides`, position -> why) in place of the stored ones."""
    items = []
    for row in content_rows(plan) if rows is None else rows:
        choice = row["conflict_choice"] if choices is None else choices.get(str(row["position"]), "")
        why = row["override_reason"] if choices is None else (overrides or {}).get(str(row["position"]), "")
        compensate = row["action"] == PlanItem.Action.COMPENSATE
        items.append(
            planning.item_content(
                position=row["position"],
                step=row["step__number"],
                server=row["step__server_name"],
                tool=row["step__tool"],
                action=row["action"],
                rule=row["rule"],
                pulled_in_by=row["pulled_in_by"],
                compensation={
                    "tool": row["tool"],
                    "arguments": row["arguments"],
                    "ifVersion": row["if_version"] or None,
                    "idempotencyKey": row["idempotency_key"],
                    # a recipe's further calls, in order: signed with the first (only when there are any)
                    **({"then": row["then"]} if row["then"] else {}),
                }
                if compensate
                else None,
                needs_human=row["needs_human"],
                via=row["via"],
                side_effect=row["side_effect"],
                cost=row["cost"],
                undo_by=row["undo_by"].isoformat() if row["undo_by"] else None,
                reason=row["reason"],
                remedy=row["remedy"],
                effect={
                    "summary": row["step__effect_summary"],
                    "resource": row["step__effect_resource"],
                    "version": row["step__effect_version"],
                    **(
                        {"fingerprint": row["step__effect_fingerprint"]}
                        if row["step__effect_fingerprint"]
                        else {}
                    ),
                },
                check={"status": row["check_status"] or None, **(row["check_detail"] or {})}
                if compensate
                else None,
                conflict_choice=choice,
                override_reason=why,
                run=str(row["step__run__public_id"]) if plan.since is not None else "",
            )
        )
    return planning.plan_content(
        plan={
            "plan": str(plan.public_id),
            "run": str(plan.run.public_id),
            "requestedBy": plan.requested_by.get_username(),
            "reason": plan.reason,
            "selection": _selection(plan),
        },
        items=items,
    )


def _selection(plan: Plan) -> dict[str, Any]:
    if plan.rest_of_id is not None:  # what a plan that stopped short did not undo: its items say which
        return {"restOf": str(plan.rest_of.public_id)}
    if plan.since is not None:  # everything the agent did since then, in every run: each item names its run
        return {"agent": plan.run.agent_name, "since": plan.since.isoformat()}
    return {"fromStep": plan.from_step} if plan.from_step is not None else {"steps": plan.chosen_steps}


def items_for_page(plan: Plan):
    """Every item with what the plan page shows of its step, in one query whatever the plan's size."""
    return plan.items.select_related("step__run", "call_step", "override_by").order_by("position").only(
        *(f.name for f in PlanItem._meta.concrete_fields if f.name != "plan"), "plan_id",
        "step__number", "step__server_name", "step__tool", "step__effect_summary", "step__effect_resource",
        "step__effect_version", "step__effect_fingerprint", "step__effect_fields", "step__finished_at",
        "step__run_id",
        "step__server_id", "step__run__public_id", "step__run__started_at", "call_step__number",
        "override_by__username")


def conflict_positions(plan: Plan) -> set[int]:
    return set(plan.items.filter(action=PlanItem.Action.COMPENSATE, check_status=PlanItem.Check.CONFLICT)
               .values_list("position", flat=True))


def site_url() -> str:
    """The site's public URL as a command prints it: PUBLIC_URL when this process was given one, else the one
    the running demo wrote down (`VAR_DIR/public-url`: `make demo` on another port, and `manage.py undo` in
    a second terminal), else PUBLIC_URL's default."""
    if "PUBLIC_URL" not in os.environ:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            written = (Path(settings.VAR_DIR) / "public-url").read_text().strip()
            if written.startswith(("http://", "https://")) and len(written) < 500:
                return written.rstrip("/")
    return settings.PUBLIC_URL.rstrip("/")


def plan_url(plan: Plan, *, absolute: bool = False) -> str:
    """The plan's page: a path, or (for messages that leave this site: an agent's error, an email) a full
    URL."""
    path = reverse("approver:plan_detail", args=[plan.public_id])
    return settings.PUBLIC_URL.rstrip("/") + path if absolute else path

