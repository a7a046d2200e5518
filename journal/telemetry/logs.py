"""Log lines people can search: JSON with the trace and span ids and the run, step, plan and agent they
belong to (`LOG_FORMAT=json`), and never a secret in any line, in either format.

What a line belongs to is bound where the work begins (`bound`: an agent's call binds its agent, then its
run and step; the worker binds the plan it works on) and read by `Context`, a logging filter, as each line is
written. `Redact` strikes out bearer tokens, the product's own tokens, passwords, cookies and signing secrets
from the message, its arguments and any exception text, before any handler sees them.
"""

import contextlib
import contextvars
import logging
import re

from pythonjsonlogger.json import JsonFormatter

from . import tracing

_FIELDS: contextvars.ContextVar[dict | None] = contextvars.ContextVar("undo_log_fields", default=None)
KEYS = ("agent", "run", "step", "plan")


@contextlib.contextmanager
def bound(**fields):
    """Log lines written inside carry `fields` (agent, run, step, plan), on top of what was bound around."""
    token = _FIELDS.set({**(_FIELDS.get() or {}), **{k: v for k, v in fields.items() if v not in (None, "")}})
    try:
        yield
    finally:
        _FIELDS.reset(token)


def bind(**fields) -> None:
    """Add `fields` to what is bound now, until the `bound` block around ends (or the task does)."""
    current = _FIELDS.get()
    _FIELDS.set({**(current or {}), **{k: v for k, v in fields.items() if v not in (None, "")}})


def current() -> dict:
    return dict(_FIELDS.get() or {})


class Context(logging.Filter):
    """Adds `trace_id`, `span_id` and the bound agent, run, step and plan to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        ids = tracing.trace_ids()
        record.trace_id, record.span_id = ids if ids else ("", "")
        fields = _FIELDS.get() or {}
        for key in KEYS:
            setattr(record, key, fields.get(key, ""))
        return True


# What is struck out of every line: the value after these words, and tokens of these shapes.
_SECRET_VALUES = re.compile(
    r"(?i)(\b(?:authorization|bearer|token|access_token|refresh_token|id_token|client_secret|secret|password|"
    r"passwd|api[_-]?key|cookie|sessionid|csrftoken|set-cookie)\b[\"']?\s*[:=]?\s*[\"']?)"
    r"(bearer\s+)?([^\s\"',;&}]{4,})")
_SECRET_SHAPES = re.compile(
    r"\b(?:agt_|uat_|whsec_|ctk_)[A-Za-z0-9_\-]{8,}|\beyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}"
    r"\.[A-Za-z0-9_\-]+")
STRUCK = "[redacted]"


def redact(text: str) -> str:
    """`text` with every secret it carries struck out."""
    text = _SECRET_SHAPES.sub(STRUCK, text)
    return _SECRET_VALUES.sub(lambda m: f"{m.group(1)}{m.group(2) or ''}{STRUCK}", text)


class Redact(logging.Filter):
    """Strikes secrets out of a record's message (arguments applied first) and exception text."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a record whose arguments do not fit its message: keep what can be read
            message = f"{record.msg!r} {record.args!r}"
        cleaned = redact(message)
        if cleaned != message or record.args:
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


class Json(JsonFormatter):
    """One JSON object a line: time, level, logger, message, trace and span ids, agent, run, step, plan."""

    def __init__(self, **kwargs):
        super().__init__(
            "%(levelname)s %(name)s %(message)s %(trace_id)s %(span_id)s %(agent)s %(run)s %(step)s %(plan)s "
            "%(process)d", rename_fields={"levelname": "level", "name": "logger"}, timestamp="time", **kwargs)

    def formatException(self, ei) -> str:  # noqa: N802 - logging's name
        return redact(super().formatException(ei))

    def formatStack(self, stack_info) -> str:  # noqa: N802 - logging's name
        return redact(super().formatStack(stack_info))

