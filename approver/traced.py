"""A plan's life as one trace: asked for, drafted, checked item by item, signed, and undone compensation by
compensation, though its parts run in different requests and worker tasks hours apart.

The plan keeps the trace context of the span that asked for it (`Plan.trace_context`, a W3C `traceparent`);
each later part opens its span as that span's child (`plan_span`), and binds the plan to its log lines. With
tracing off nothing is kept and every span is a no-op; the log lines still name the plan."""

import contextlib

from opentelemetry import propagate, trace

from journal.telemetry import logs, tracing

from .models import Plan


def new_plan(**fields) -> Plan:
    """A plan made now (`Plan.objects.create(**fields)`), its trace begun (`asked`)."""
    plan = Plan(**fields)
    asked(plan)
    plan.save(force_insert=True)
    return plan


def asked(plan: Plan) -> None:
    """The plan was just asked for: its trace begins here (the child of the request's, when that is traced),
    and the plan keeps where (saved by the caller)."""
    if not tracing.on():
        return
    with tracing.TRACER.start_as_current_span("plan requested", attributes=_about(plan)):
        carrier: dict = {}
        propagate.inject(carrier)
    plan.trace_context = carrier.get("traceparent", "")


@contextlib.contextmanager
def plan_span(plan: Plan, name: str, **attributes):
    """A span of the plan's trace (`name`), current inside, with the plan bound to the log lines."""
    with logs.bound(plan=str(plan.public_id)):
        if not tracing.on():
            yield None
            return
        parent = propagate.extract({"traceparent": plan.trace_context}) if plan.trace_context else None
        links = _request_link()
        with tracing.TRACER.start_as_current_span(name, context=parent, links=links,
                                                  attributes={**_about(plan), **attributes}) as span:
            yield span


def signed(plan: Plan, approval) -> None:
    """An approver's signature, as a span of the plan's trace (the signing request's own is linked)."""
    with plan_span(plan, "plan signature", **{"undo.approval.decision": approval.decision,
                                               "undo.approver": approval.approver.get_username()}):
        pass


def item_span(name: str, item, **attributes):
    """A span for one item of the plan whose span is current (a check, a compensation)."""
    if not tracing.on():
        return contextlib.nullcontext()
    return tracing.TRACER.start_as_current_span(name, attributes={
        "undo.plan.item": item.position, "undo.step": item.step.number, "gen_ai.tool.name": item.tool or "",
        **attributes})


def _about(plan: Plan) -> dict:
    return {"undo.plan.id": str(plan.public_id), "undo.run.id": str(plan.run.public_id)}


def _request_link() -> list:
    """The request or task this part of the plan runs in, when it has a trace of its own: linked, so both
    can be found from either."""
    current = trace.get_current_span().get_span_context()
    return [trace.Link(current)] if current.is_valid else []
