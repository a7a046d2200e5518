"""OpenTelemetry traces, off unless the standard `OTEL_*` variables ask for them.

Tracing is on when `OTEL_TRACES_EXPORTER` names an exporter (`otlp`, the default once an endpoint is set, or
`console`), or `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set; and
`OTEL_SDK_DISABLED=true` turns it off whatever else says. Everything else the SDK reads itself: the service's
name and resource (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`), the sampler (`OTEL_TRACES_SAMPLER`,
`OTEL_TRACES_SAMPLER_ARG`), the exporter's endpoint, headers and timeout (`OTEL_EXPORTER_OTLP_*`, OTLP over
HTTP with protobuf) and the propagators (`OTEL_PROPAGATORS`, W3C trace context by default).

`configure` installs the SDK and the Django, Celery, HTTPX and psycopg instrumentations once per process;
the product's own spans (an agent's call in `calls`, a plan's life in `approver.traced`) go through
`TRACER`, which does nothing while tracing is off.
"""

import contextlib
import logging
import os
import time

from opentelemetry import context, propagate, trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.instrumentation.django import DjangoInstrumentor
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

logger = logging.getLogger(__name__)

TRACER = trace.get_tracer("agent-undo")
SERVICE = "agent-undo"
state = {"on": False}


def wanted(environ=os.environ) -> bool:
    """Whether the standard variables ask for traces."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def on() -> bool:
    return state["on"]


def _exporter(environ=os.environ):
    names = [n.strip().lower() for n in environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if n.strip()]
    if names == ["console"]:
        return ConsoleSpanExporter()
    if names != ["otlp"]:
        raise ValueError(f"OTEL_TRACES_EXPORTER={','.join(names)}: this product exports traces with otlp "
                         "(OTLP over HTTP) or console")
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    if protocol and protocol != "http/protobuf":
        raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol}: this product sends OTLP over HTTP "
                         "(http/protobuf); point it at the collector's HTTP port (4318)")
    return OTLPSpanExporter()


def configure(environ=os.environ) -> bool:
    """Install the SDK and the instrumentations in this process, if the variables ask for traces (once;
    later calls change nothing). Returns whether tracing is on."""
    if state["on"] or not wanted(environ):
        return state["on"]
    exporter = _exporter(environ)
    attributes = {} if environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: SERVICE}
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    DjangoInstrumentor().instrument()
    CeleryInstrumentor().instrument()
    HTTPXClientInstrumentor().instrument()
    PsycopgInstrumentor().instrument(enable_commenter=False)
    state["on"] = True
    return True


def flush(timeout_millis: int = 5000) -> None:
    """Send every finished span now (a process about to stop, a test that reads them)."""
    provider = trace.get_tracer_provider()
    if hasattr(provider, "force_flush"):
        provider.force_flush(timeout_millis)


def parent_from(meta) -> context.Context | None:
    """The caller's trace, when its request's `_meta` carries one (`traceparent`, `tracestate`: the MCP
    semantic conventions' place for it, which every transport has)."""
    if not state["on"] or not isinstance(meta, dict) or not isinstance(meta.get("traceparent"), str):
        return None
    return propagate.extract({key: meta[key] for key in ("traceparent", "tracestate")
                              if isinstance(meta.get(key), str)})


def with_trace(meta):
    """`meta` for a request going out, with the current span's trace context in it (`traceparent`,
    `tracestate`), replacing any the caller sent: the server's spans are children of the Recorder's. While
    tracing is off, `meta` as it was: nothing is added."""
    if not state["on"]:
        return meta
    carrier: dict = {}
    propagate.inject(carrier)
    if not carrier:
        return meta
    return {**(meta if isinstance(meta, dict) else {}), **carrier}


def headers_with_trace(headers: dict) -> dict:
    """HTTP headers with the current span's trace context added (while tracing is on)."""
    if state["on"]:
        propagate.inject(headers)
    return headers


def trace_ids() -> tuple[str, str] | None:
    """The current span's (trace id, span id) in hex, for a log line; None outside a recorded span."""
    if not state["on"]:
        return None
    span_context = trace.get_current_span().get_span_context()
    if not span_context.is_valid:
        return None
    return format(span_context.trace_id, "032x"), format(span_context.span_id, "016x")


def span_between(name: str, began: float, ended: float, attributes: dict) -> None:
    """A finished span `name` from `began` to `ended` (`time.perf_counter` readings), the child of the
    current span, when there is one: work measured once for several traces (a journal group's commit)."""
    if not trace.get_current_span().get_span_context().is_valid:
        return
    now_ns, now = time.time_ns(), time.perf_counter()
    span = TRACER.start_span(name, start_time=now_ns - int((now - began) * 1e9), attributes=attributes)
    span.end(end_time=now_ns - int((now - ended) * 1e9))


@contextlib.contextmanager
def child_span(name: str, attributes: dict):
    """A span `name`, the child of the current one, current inside (None while tracing is off)."""
    if not state["on"]:
        yield None
        return
    with TRACER.start_as_current_span(name, attributes=attributes) as span:
        yield span
