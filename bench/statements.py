"""What each of the hot path's statements costs, hand-built (journal/record/sql.py) and through the ORM.

    .venv/bin/python bench/statements.py [--repeat 2000] [--postgres URL]

On a scratch SQLite database (or, with --postgres, a scratch database on that server), times the four
statements every journaled call makes on a run: the run's row read and locked, the step inserted, the chain
entry inserted, the run's moving columns written back; each made by `journal.record.sql` and by the ORM
(`select_for_update().only()`, `objects.create`, `filter().update()`), in one transaction per round as the
journal does, then the commit. On PostgreSQL, a third way: the ORM with the backend's `server_side_binding` on
(psycopg binds the parameters on the server and prepares a statement once it has run five times), so the
figure says whether the hand-built statements still pay for themselves. Prints microseconds a statement,
the median of the rounds.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from sessions import scratch_postgres  # noqa: E402


def setup(database_url: str | None) -> None:
    scratch = Path(tempfile.mkdtemp(prefix="statements-bench-"))
    os.environ.update({"VAR_DIR": str(scratch), "RECORDER_KEY_DIR": str(scratch / "keys"),
                       "DJANGO_SETTINGS_MODULE": "approver.settings", "DEBUG": "0"})
    os.environ.pop("DATABASE_URL", None)
    if database_url:
        os.environ["DATABASE_URL"] = database_url
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2000)
    parser.add_argument("--postgres", metavar="URL")
    args = parser.parse_args()
    with scratch_postgres(args.postgres) as database_url:
        setup(database_url)
        figures = measure(args.repeat)
    print(f"µs a statement, median of {args.repeat} rounds, on {'PostgreSQL' if database_url else 'SQLite'}:")
    ways = list(next(iter(figures.values())))
    print(f"  {'statement':<28}" + "".join(f"{way:>26}" for way in ways))
    for statement, by_way in figures.items():
        print(f"  {statement:<28}" + "".join(f"{by_way[way]:>26.0f}" for way in ways))


def measure(repeat: int) -> dict[str, dict[str, float]]:
    from django.contrib.auth.models import User
    from django.db import connection, transaction
    from django.utils import timezone

    from journal import services
    from journal.models import ChainEntry, Run, Step
    from journal.record import sql
    from journal.services.record import RUN_MOVING_FIELDS

    agent, _ = services.create_agent(name="bench-bot", on_behalf_of=User.objects.create_user("bench"))
    run = Run.objects.create(agent=agent, key="run:bench", team=agent.team)
    locked = ("id", *RUN_MOVING_FIELDS, "halted_by_plan")
    counter = iter(range(1, 10**9))

    def step_values(number):
        return {"run_id": run.pk, "number": number, "server_name": "legacy", "tool": "echo",
                "arguments": {"i": number}, "started_at": timezone.now(), "status": "pending",
                "declaration": {"kind": "unknown"}, "declaration_source": "none", "reversibility": "unknown"}

    def entry_values(seq):
        return {"run_id": run.pk, "seq": seq, "ts": "2026-12-07T10:00:00.000000Z", "event": "call",
                "data": sql.JsonText('{"arguments":{"i":1},"server":"legacy","step":1,"tool":"echo"}'),
                "prev_hash": "0" * 64, "hash": "1" * 64}

    moving = {name: getattr(run, name) for name in RUN_MOVING_FIELDS}
    hand = {
        "run row read and locked": lambda: sql.locked_row(Run, locked, "id = %s", [run.pk]),
        "step inserted": lambda: sql.insert(Step, step_values(next(counter))),
        "chain entry inserted": lambda: sql.insert(ChainEntry, entry_values(next(counter)), returning=False),
        "run's columns written back": lambda: sql.update(Run, run.pk, moving),
    }
    orm = {
        "run row read and locked": lambda: Run.objects.select_for_update().only(*locked).get(pk=run.pk),
        "step inserted": lambda: Step.objects.create(**step_values(next(counter))),
        "chain entry inserted": lambda: ChainEntry.objects.create(**entry_values(next(counter))),
        "run's columns written back": lambda: Run.objects.filter(pk=run.pk).update(**moving),
    }
    ways = {"hand-built (sql.py)": hand, "ORM": orm}
    if connection.vendor == "postgresql":
        ways["ORM, server-side binding"] = orm
    timings = {way: {name: [] for name in (*hand, "commit")} for way in ways}
    for way, statements in ways.items():  # each way on a connection of its own settings, warmed first
        connection.close()
        if connection.vendor == "postgresql":
            connection.settings_dict["OPTIONS"]["server_side_binding"] = way.endswith("server-side binding")
        for round_ in range(repeat + 50):
            with transaction.atomic():
                for name, statement in statements.items():
                    started = time.perf_counter()
                    statement()
                    if round_ >= 50:
                        timings[way][name].append((time.perf_counter() - started) * 1e6)
                started = time.perf_counter()
            if round_ >= 50:
                timings[way]["commit"].append((time.perf_counter() - started) * 1e6)
    connection.close()
    return {name: {way: statistics.median(timings[way][name]) for way in ways} for name in (*hand, "commit")}


if __name__ == "__main__":
    main()
