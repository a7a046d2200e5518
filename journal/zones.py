"""One clock: every page is in the viewer's own time zone, named. The browser says which (`static/times.js`
keeps it in the `zone` cookie, an IANA name); each request reads its times in it (`viewer_zone`), and forms
read typed times in it too. A name that is not a known zone is ignored: the site's zone (TIME_ZONE) then."""

import zoneinfo
from contextlib import contextmanager
from functools import lru_cache
from urllib.parse import unquote

from django.core.management.base import CommandError
from django.utils import timezone

COOKIE = "zone"


@lru_cache(maxsize=1)
def _known() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def zone_named(name: str) -> zoneinfo.ZoneInfo | None:
    """The zone an IANA name names, or None when it names none."""
    if not name or len(name) > 64 or name not in _known():
        return None
    return zoneinfo.ZoneInfo(name)


def viewer_zone(get_response):
    """Middleware: the request's times are in the zone its viewer's browser said (else the site's)."""
    def middleware(request):
        zone = zone_named(unquote(request.COOKIES.get(COOKIE, "")))
        if zone is not None:
            timezone.activate(zone)
        try:
            return get_response(request)
        finally:
            timezone.deactivate()

    return middleware


def zone(request) -> dict[str, str]:
    """Context processor: the zone the page's times are in (its IANA name), for `<html data-zone>`."""
    return {"viewer_zone": timezone.get_current_timezone_name()}


@contextmanager
def in_zone(name: str | None):
    """For a command's `--zone NAME`: its times shown and read in that zone (else the server's);
    CommandError when the name names none."""
    chosen = zone_named(name) if name else timezone.get_default_timezone()
    if chosen is None:
        raise CommandError(f"--zone {name!r} is not a time zone: give an IANA name, such as Europe/Berlin or "
                           "UTC.")
    with timezone.override(chosen):
        yield chosen
