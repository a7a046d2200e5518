"""The SQL classifier against its corpus (tests/journal/undo/sql_corpus.py): how many statements of each
kind, how many were read as another kind, how many writes were read as reads (the figure that must be 0),
and how fast each dialect's reader goes.

    .venv/bin/python bench/sql_corpus.py
"""

import os
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "approver.settings")

from journal.undo.database import postgres, sqlite  # noqa: E402
from tests.journal.undo.sql_corpus import SQLITE_SCHEMA, corpus  # noqa: E402


def main() -> None:
    for dialect in ("postgresql", "sqlite"):
        cases = corpus(dialect)
        started = time.perf_counter()
        found = [(postgres.read(text) if dialect == "postgresql" else sqlite.read(text, schema=SQLITE_SCHEMA))
                 .kind for text, _ in cases]
        seconds = time.perf_counter() - started
        kinds = Counter(kind for _, kind in cases)
        wrong = sum(1 for (_, kind), got in zip(cases, found, strict=True) if kind != got)
        writes_as_reads = sum(1 for (_, kind), got in zip(cases, found, strict=True)
                              if kind in ("rows", "destroy", "refused") and got == "read")
        counted = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
        print(f"{dialect}: {len(cases)} statements ({counted}); "
              f"read as another kind: {wrong}; writes read as reads: {writes_as_reads}; "
              f"{len(cases) / seconds:,.0f} texts/s")


if __name__ == "__main__":
    main()
