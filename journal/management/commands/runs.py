from datetime import datetime

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from journal import services, zones
from journal.models import Agent, Run


def _moment(text: str | None, option: str) -> datetime | None:
    if text is None:
        return None
    moment = parse_datetime(text)
    if moment is None:
        raise CommandError(f"{option} {text!r} is not a time: use ISO 8601, such as 2026-12-01T03:10 or "
                           "2026-12-01T03:10:00+00:00.")
    return timezone.make_aware(moment) if timezone.is_naive(moment) else moment


class Command(BaseCommand):
    help = (
        "List runs, newest first: by agent, state and the time they were active (a run is active from its "
        "first call to its last). Times are shown, and times typed without an offset are read, in --zone "
        "(default: the server's, TIME_ZONE); the listing names it."
    )

    def add_arguments(self, parser):
        parser.add_argument("--agent", help="Only this agent's runs (its name).")
        parser.add_argument("--state", choices=[value for value, _ in Run.State.choices])
        parser.add_argument("--since", help="Only runs active at or after this time.")
        parser.add_argument("--until", help="Only runs active at or before this time.")
        parser.add_argument("--at", help="Only runs active at this time (--since and --until both).")
        parser.add_argument("--limit", type=int, default=50, help="At most this many (default 50).")
        parser.add_argument("--zone", help="The time zone to show and read times in, an IANA name such as "
                                           "Europe/Berlin (default: the server's).")

    def handle(self, *args, zone=None, **options):
        with zones.in_zone(zone):
            self._list(**options)

    def _list(self, *, agent=None, state=None, since=None, until=None, at=None, limit=50, **options):
        if limit < 1:
            raise CommandError("--limit must be at least 1.")
        found_agent = None
        if agent is not None:
            found_agent = Agent.objects.filter(name=agent).first()
            if found_agent is None:
                raise CommandError(f"No agent named {agent!r}.")
        if at is not None:
            since = until = at
        runs = services.runs_matching(Run.objects.for_list(), agent=found_agent, state=state or "",
                                      since=_moment(since, "--since"), until=_moment(until, "--until"))
        listed = list(runs[:limit])
        if not listed:
            self.stdout.write("No runs match.")
            return
        self.stdout.write(f"Times are in {timezone.get_current_timezone_name()}.")
        self.stdout.write(f"{'run':<36}  {'agent':<20}  {'started':<16}  {'last call':<16}  {'steps':>5}  "
                          f"{'state':<8}  grouped by")
        for run in listed:
            grouped = (
                run.key.split(":", 1)[0] if run.key else ("idle rule, ended" if run.ended_at else "idle rule")
            )
            if run.imported_from:
                grouped = f"imported from {run.imported_from}"
            self.stdout.write(
                f"{run.public_id!s:<36}  {run.agent_name[:20]:<20}  {_when(run.started_at):<16}  "
                f"{_when(run.last_activity_at):<16}  {run.step_count:>5}  {run.state:<8}  {grouped}")
        if len(listed) == limit:
            self.stdout.write(f"(the newest {limit}; --limit shows more)")


def _when(moment: datetime) -> str:
    return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M")
