"""How fast a long run's record is verified, exported and imported, and in how much memory.

    .venv/bin/python bench/record_speed.py [--entries 3000 30000] [--postgres URL]

For each size, builds one run of N chain entries on a scratch SQLite database (or, with --postgres, a scratch
database on that server, created and dropped after) (calls and results as the
Recorder writes them, a signed checkpoint every RECORDER_CHECKPOINT_EVERY entries), then, each in a process
of its own so that its peak memory is its own, times `verify_run`, the export to a file (`write_bundle`, as
`manage.py export_run -o` writes it) and the import of that file as another Recorder's (`import_bundle`:
read, verify, store). Prints entries per second for each (target: at least 25,000) and each process's peak
resident memory, above what it held before the work began: flat in the run's length is the target.
"""

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import psycopg  # noqa: E402
from sessions import scratch_postgres  # noqa: E402

PHASES = ("verify", "export", "import")


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def setup(scratch: Path) -> None:
    if (scratch / "database_url").exists():
        os.environ["DATABASE_URL"] = (scratch / "database_url").read_text()
    os.environ.update({"VAR_DIR": str(scratch), "RECORDER_KEY_DIR": str(scratch / "keys"),
                       "DJANGO_SETTINGS_MODULE": "approver.settings", "PUBLIC_URL": "http://here.example"})
    import django

    django.setup()


def build(entries: int, database_url: str = "") -> Path:
    """A scratch database holding one run of `entries` entries (on PostgreSQL at `database_url`, if given)."""
    scratch = Path(tempfile.mkdtemp(prefix="record-speed-"))
    if database_url:
        (scratch / "database_url").write_text(database_url)
    setup(scratch)
    from django.core.management import call_command
    from django.db import transaction
    from django.utils import timezone

    from journal.services.record import append_entry, open_run, save_moving

    call_command("migrate", verbosity=0)
    now = timezone.now()
    with transaction.atomic():
        run = open_run(agent=None, key="", now=now, label="bench-bot")
        for n in range(1, entries):
            step = (n + 1) // 2
            if n % 2:
                data = {"step": step, "server": "crm", "tool": "update_deal",
                        "arguments": {"deal_id": f"D-{step}", "stage": "Won", "note": "x" * 80},
                        "declaration": {"kind": "compensate", "via": "api", "window": "P7D"}}
                event = "call"
            else:
                said = f"Deal D-{step} stage: Proposal → Won"
                data = {"step": step, "status": "ok", "isError": False, "durationMs": 9.25,
                        "result": {"content": [{"type": "text", "text": said}],
                                   "structuredContent": {"deal": {"id": f"D-{step}", "version": f"v{step}"}}},
                        "links": [{"from": "/structuredContent/deal/id", "to": "/deal_id"}]}
                event = "result"
            append_entry(run=run, event=event, data=data, now=now)
        save_moving(run, now=None)
    return scratch


def phase(name: str, scratch: Path, profile: bool) -> None:
    """One phase on the scratch database, in this process; prints one line."""
    setup(scratch)
    from django.test import override_settings

    from journal import services
    from journal.models import Run

    run = Run.objects.order_by("id").first()
    bundle = scratch / "run.json"
    if name == "verify":
        def work():
            verdict = services.verify_run(run=run)
            assert verdict.ok, verdict
    elif name == "export":
        def work():
            with bundle.open("w", encoding="utf-8") as out:
                services.write_bundle(run=run, out=out)
    else:
        Run.objects.filter(pk=run.pk).delete()

        def work():
            with override_settings(PUBLIC_URL="http://elsewhere.example"):
                return services.import_bundle(path=bundle)
    entries = run.head_seq
    before = peak_mb()
    started = time.perf_counter()
    if profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.runcall(work)
        stats = pstats.Stats(profiler).sort_stats(os.environ.get("PROFILE_SORT", "cumulative"))
        stats.print_stats(25)
        if callers := os.environ.get("PROFILE_CALLERS"):  # who calls a function of the profile, by name
            stats.print_callers(callers)
    else:
        work()
    seconds = time.perf_counter() - started
    if name == "import":
        assert Run.objects.get().head_seq == entries
    print(f"  {name:<8} {entries / seconds:>9,.0f} entries/s ({seconds:.2f} s), "
          f"peak memory {peak_mb():.0f} MB ({peak_mb() - before:+.0f} MB over the process before it)",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, nargs="+", default=[3_000, 30_000])
    parser.add_argument("--profile", choices=PHASES, help="profile one of them")
    parser.add_argument("--postgres", metavar="URL", help="a PostgreSQL server to run on instead of SQLite")
    parser.add_argument("--phase", choices=PHASES, help=argparse.SUPPRESS)
    parser.add_argument("--scratch", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        phase(args.phase, args.scratch, args.profile == args.phase)
        return
    with scratch_postgres(args.postgres) as database_url:
        for entries in args.entries:
            scratch = _built(entries, database_url or "")
            size = f"one run of {entries:,} entries on {'PostgreSQL' if database_url else 'SQLite'}"
            print(size, flush=True)
            for name in PHASES:
                command = [sys.executable, __file__, "--phase", name, "--scratch", str(scratch)]
                if args.profile:
                    command += ["--profile", args.profile]
                subprocess.run(command, check=True)
            print(f"  bundle file {(scratch / 'run.json').stat().st_size / 2**20:.1f} MiB", flush=True)
            if database_url:  # the next size starts on an empty database
                with psycopg.connect(database_url, autocommit=True) as connection:
                    connection.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")


def _built(entries: int, database_url: str) -> Path:
    """Build the run in a child process too, so the parent stays small and each size starts clean."""
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
            f"from bench.record_speed import build; print(build({entries}, {database_url!r}))")
    output = subprocess.run([sys.executable, "-c", code],
                            check=True, capture_output=True, text=True, cwd=ROOT).stdout
    return Path(output.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
