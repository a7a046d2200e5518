import json

from django import template

register = template.Library()


@register.filter
def pretty_json(value) -> str:
    """JSON as the wire carries it, indented for reading (autoescaped by the template)."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
