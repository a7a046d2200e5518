"""The conformance matrix: every pairing the Recorder is checked on, and how many pass.

    .venv/bin/python bench/conformance.py

Runs tests/journal/test_pairings.py (agents on both SDK client modes and the TypeScript SDK's client,
against the npm reference server-everything over stdio, PyPI's mcp-server-time over stdio and the sample
servers over streamable HTTP, each compared with a direct call) and prints one line per check, then
"pairings passed / total". Needs Node and `npm ci --prefix tests/conformance` (make test does it).
"""

import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="conformance-") as scratch:
        report = Path(scratch) / "report.xml"
        env = {**os.environ, "VAR_DIR": str(Path(scratch) / "var"), "REQUIRE_SERVICES": "1"}
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                        "tests/journal/test_pairings.py"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
        cases = ET.parse(report).getroot().iter("testcase")
        rows = [(case.get("name"), "fail" if case.find("failure") is not None or case.find("error") is not None
                 else "skip" if case.find("skipped") is not None else "pass") for case in cases]
    width = max(len(name) for name, _ in rows)
    for name, outcome in rows:
        print(f"  {name.removeprefix('test_'):<{width}}  {outcome}")
    passed = sum(outcome == "pass" for _, outcome in rows)
    print(f"pairings passed / total: {passed} / {len(rows)}")
    sys.exit(0 if passed == len(rows) else 1)


if __name__ == "__main__":
    main()
