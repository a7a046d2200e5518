"""What reading an agent's SQL costs on PostgreSQL before it is sent, with and without PostgreSQL resolving
what a row change evaluates (issue 58: a SELECT derived from the change, made into a temporary view and
rolled back, so a function called by column notation or a cast to a domain is seen in a write).

    .venv/bin/python bench/database_reading.py [--postgres URL] [--calls 600]

Makes a scratch copy of the test CRM on the PostgreSQL at URL (a superuser's; default the CI's), installs
the capture, and reads a single-row UPDATE and a single-row SELECT on the Recorder's connection, the
"without" reading interleaved with the "with" one call by call. Prints the median of each.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "approver.settings")

import django  # noqa: E402

django.setup()

from journal.undo.database import resolving  # noqa: E402
from journal.upstream import database  # noqa: E402
from tests.journal.undo.databases import AGENT_ROLE, postgres_crm  # noqa: E402

TEXTS = {"UPDATE": "UPDATE contacts SET status = 'archived' WHERE id = 7",
         "SELECT": "SELECT id, name FROM contacts WHERE id = 7"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", default="postgres://undo_ci:undo_ci@localhost:5432/postgres")
    parser.add_argument("--calls", type=int, default=600)
    args = parser.parse_args()
    resolved = resolving.selects

    def unresolved(text: str):  # the reading as it was: plain SELECTs only
        return [select for select in resolved(text) if not select[2]]

    with postgres_crm(args.postgres) as (recorder_url, _):
        database.install(recorder_url, ["contacts", "companies"], agent_roles=[AGENT_ROLE])
        with database.connected(recorder_url) as connection:
            for verb, text in TEXTS.items():
                times: dict[str, list[float]] = {"without": [], "with": []}
                for _ in range(args.calls):
                    for name, selects in (("without", unresolved), ("with", resolved)):
                        resolving.selects = selects
                        started = time.perf_counter()
                        database.read_statements(connection, text)
                        times[name].append(time.perf_counter() - started)
                resolving.selects = resolved
                skip = args.calls // 6
                medians = {name: statistics.median(t[skip:]) * 1000 for name, t in times.items()}
                added = medians["with"] - medians["without"]
                print(f"a single-row {verb}: read in {medians['with']:.2f} ms with what it evaluates "
                      f"resolved, {medians['without']:.2f} ms without (+{added:.2f} ms)")


if __name__ == "__main__":
    main()
