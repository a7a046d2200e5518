import json

from django import template
from django.urls import reverse

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
