import json
from datetime import datetime

from django import template
from django.urls import reverse
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import conditional_escape, format_html, format_html_join
from django.utils.safestring import mark_safe

from journal import visible
from journal.undo import fields, recipe_text
from journal.views import STEPS_PER_PAGE

register = template.Library()


@register.filter
def pretty_json(value) -> str:
    """JSON as the wire carries it, indented for reading (autoescaped by the template)."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


@register.filter
def no_stop(value):
    """A server's or an agent's sentence without its closing full stop, where the page adds its own (else
    "If it goes wrong, the remedy is: send a correction email.." reads doubled)."""
    if not isinstance(value, str):
        return value
    return value.rstrip().removesuffix(".")  # one stop only: "wait..." keeps its ellipsis with the page's


@register.filter
def shown(value):
    """An agent's or a server's words as an approver must see them (`journal.visible`): each hidden
    character as ⟨U+…⟩, a long run of spaces counted, a letter of another script inside a word marked, and
    a flag saying so beside the value. Words with nothing to hide are shown exactly as they are (escaped)."""
    if value is None or value == "":
        return "" if value is None else value
    revealed = visible.reveal(str(value))
    if not revealed.flags:
        return conditional_escape(value)
    inner = mark_safe("".join(
        conditional_escape(piece.text) if not piece.kind
        else format_html('<mark class="{}" title="{}">{}</mark>', piece.kind, piece.title,
                         piece.text)
        for piece in revealed.pieces))
    flags = format_html_join("; ", "{}", ((flag,) for flag in revealed.flags))
    return format_html('<span class="flagged">{}</span> <strong class="flag" role="note">⚠ {}</strong>',
                       inner, flags)


@register.simple_tag
def step_url(run_public_id, number: int) -> str:
    """The run page that shows step `number` (the steps are paged), anchored at it."""
    page = (int(number) - 1) // STEPS_PER_PAGE + 1
    return f"{reverse('journal:run_detail', args=[run_public_id])}?page={page}#step-{number}"


@register.simple_tag
def moment(value, fmt: str = "M j, H:i"):
    """A moment kept as text (an ISO 8601 string in a JSON field, or a server's RFC 3339 `changedAt`) as a
    person reads it (`when`); text that is not a moment is shown as it is."""
    return when(value, fmt)


@register.filter
def record_words(resource):
    """A record as people name it (`recipe_text.record_name`): "deal D-881", "globex-brief.md"."""
    return recipe_text.record_name(str(resource or ""))


@register.filter
def when(value, fmt: str = "M j, H:i"):
    """A moment (a datetime, or ISO 8601 text from a JSON field) as a person reads it, with its zone named:
    `<time datetime="…" data-format="…">Dec 4, 02:31 UTC</time>`; the page's script (`times.js`) shows it in
    the viewer's own time zone, naming that zone. Text that is not a moment is shown as it is."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return value
    if not isinstance(value, datetime):
        return "" if value is None else value
    if timezone.is_aware(value):
        value = timezone.localtime(value)
    zone = f" {value.tzname()}" if value.tzinfo else ""
    return format_html('<time datetime="{}" data-format="{}">{}{}</time>', value.isoformat(), fmt,
                       date_format(value, fmt), zone)


@register.simple_tag
def after_the_agent(value, finished) -> str:
    """How long after the agent's call a server says a record changed (`recipe_text.after_the_agent`)."""
    return recipe_text.after_the_agent(value, finished)


@register.filter
def changed_cells(row) -> dict[str, bool]:
    """Which cells of a three-way row to mark as changed (`journal.undo.fields.marks`)."""
    return fields.marks(row)
