import json
from datetime import datetime

from django import template
from django.urls import reverse
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html

from journal.views import STEPS_PER_PAGE

register = template.Library()


@register.filter
def pretty_json(value) -> str:
    """JSON as the wire carries it, indented for reading (autoescaped by the template)."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


@register.simple_tag
def step_url(run_public_id, number: int) -> str:
    """The run page that shows step `number` (the steps are paged), anchored at it."""
    page = (int(number) - 1) // STEPS_PER_PAGE + 1
    return f"{reverse('journal:run_detail', args=[run_public_id])}?page={page}#step-{number}"


@register.simple_tag
def moment(value, fmt: str = "M j, H:i"):
    """A moment kept as text (an ISO 8601 string in a JSON field, or a server's RFC 3339 `changedAt`) as a
    person reads it, in a <time> element; text that is not a moment is shown as it is."""
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return value
    elif isinstance(value, datetime):
        parsed = value
    else:
        return "" if value is None else value
    if timezone.is_aware(parsed):
        parsed = timezone.localtime(parsed)
    return format_html('<time datetime="{}">{}</time>', parsed.isoformat(), date_format(parsed, fmt))
