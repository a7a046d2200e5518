"""Per-address limits on the endpoints anyone may call without signing in: OAuth client registration and
the token endpoint. Each costs a database write or a secret check, and both run in the Recorder's process,
so an anonymous flood of them would slow every agent's calls.

Counted per client address (IPv6 by its /64) in fixed windows, by django-ratelimit in Django's cache: with
REDIS_URL set, every process counts together; without it, each process counts its own (the demo's one
process). The address is the connection's, which behind a proxy is right only when uvicorn runs with
--forwarded-allow-ips naming the proxy (docs/production.md). If the cache cannot be reached, the request goes
on (logged): a limit that is down must not take sign-in down with it.
"""

import logging

from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django_ratelimit.core import get_usage

logger = logging.getLogger(__name__)


def refusal(request, *, group: str, limit: int, per: str) -> JsonResponse | None:
    """Count this request against `limit` a `per` ("m", "h") from its address: None while under it, else the
    429 answer, with Retry-After."""
    try:
        usage = get_usage(request, group=group, key="ip", rate=f"{limit}/{per}", increment=True)
    except Exception:  # noqa: BLE001 - any cache failure: see the module's docstring
        logger.warning("The %s limit could not be counted (is the cache down?); the request goes on.", group,
                       exc_info=True)
        return None
    if usage is None or not usage["should_limit"]:
        return None
    wait = max(int(usage["time_left"]), 1)
    window = {"m": "a minute", "h": "an hour"}[per]
    response = JsonResponse({
        "error": "too_many_requests",
        "error_description": f"At most {limit} of these {window} from one address; try again in {wait} s.",
    }, status=429)
    response["Retry-After"] = str(wait)
    return response


class Throttled:
    """A view whose POSTs count against a per-address limit (`limit()` returns (count, "m" | "h")). Its
    clients send no cookie and no form, so like the toolkit's own endpoints it takes no CSRF token."""

    throttle_group = ""

    def limit(self) -> tuple[int, str]:
        raise NotImplementedError

    @classmethod
    def as_view(cls, **initkwargs):
        return csrf_exempt(super().as_view(**initkwargs))

    def dispatch(self, request, *args, **kwargs):
        if request.method == "POST":
            count, per = self.limit()
            if (refused := refusal(request, group=self.throttle_group, limit=count, per=per)) is not None:
                return refused
        return super().dispatch(request, *args, **kwargs)
