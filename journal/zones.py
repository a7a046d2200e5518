"""One clock: every page is in the viewer's own time zone, named. The browser says which (`static/times.js`
keeps it in the `zone` cookie, an IANA name); each request reads its times in it (`viewer_zone`), and forms
read typed times in it too. A name that is not a known zone is ignored: the site's zone (TIME_ZONE) then."""

import zoneinfo
from functools import lru_cache
from urllib.parse import unquote

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
