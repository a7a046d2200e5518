"""How fast a long run's record is verified, exported and imported.

    .venv/bin/python bench/record_speed.py [--entries 30000]

Builds one run of N chain entries on a scratch SQLite database (calls and results as the Recorder writes
them, a signed checkpoint every RECORDER_CHECKPOINT_EVERY entries), then times `verify_run`, the export
(`export_bundle` and its JSON text, as `manage.py export_run` writes it) and the import of that text as
another Recorder's (`import_bundle`: parse, verify, store). Prints entries per second for each (target: at
least 25,000) and the process's peak resident memory after each.
"""

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=30_000)
    parser.add_argument("--profile", choices=("verify", "export", "import"), help="profile one of them")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="record-speed-"))
    os.environ.update({"VAR_DIR": str(scratch), "RECORDER_KEY_DIR": str(scratch / "keys"),
                       "DJANGO_SETTINGS_MODULE": "approver.settings", "PUBLIC_URL": "http://here.example"})
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import transaction
    from django.test import override_settings
    from django.utils import timezone

    from journal import services
    from journal.models import Run
    from journal.services.record import append_entry, open_run, save_moving

    call_command("migrate", verbosity=0)
    now = timezone.now()
    with transaction.atomic():
        run = open_run(agent=None, key="", now=now, label="bench-bot")
        for n in range(1, args.entries):
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
    run = Run.objects.get(pk=run.pk)
    print(f"one run of {run.head_seq} entries, {run.checkpoints.count()} signed checkpoints")

    def timed(name, work):
        started = time.perf_counter()
        if args.profile == name:
            import cProfile
            import pstats

            profiler = cProfile.Profile()
            result = profiler.runcall(work)
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
        else:
            result = work()
        seconds = time.perf_counter() - started
        print(f"  {name:<8} {args.entries / seconds:>9,.0f} entries/s ({seconds:.2f} s), "
              f"peak memory so far {peak_mb():.0f} MB")
        return result

    verdict = timed("verify", lambda: services.verify_run(run=run))
    assert verdict.ok, verdict
    text = timed("export", lambda: json.dumps(services.export_bundle(run=run)))
    Run.objects.filter(pk=run.pk).delete()
    with override_settings(PUBLIC_URL="http://elsewhere.example"):
        imported = timed("import", lambda: services.import_bundle(text=text))
    assert imported.head_seq == args.entries


if __name__ == "__main__":
    main()
