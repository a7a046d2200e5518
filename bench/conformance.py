"""The conformance matrix: every pairing the Recorder is checked on, and how many pass.

    .venv/bin/python bench/conformance.py

Runs the conformance tests: tests/journal/test_conformance.py (every tool of server-everything over stdio
and streamable HTTP, server-memory, server-filesystem, mcp-server-time, mcp-server-git and mcp-server-fetch,
with the `mcp` SDK's client in both modes and the TypeScript SDK's client, each compared with a direct
call), test_pairings.py (protocol pairings, verbatim errors, progress, cancellation, input_required),
test_versions_pairings.py (agents and servers on 2025-03-26, 2025-06-18 and 2025-11-25), test_features.py
(resources, prompts, completion, logging, elicitation, sampling, roots) and test_large_results.py (5 MB
results from every kind of server to both client modes, and answers over the limit). Prints the matrix of
servers by clients, one line per other check, and "pairings passed / total". Needs Node and
`npm ci --prefix tests/conformance` (make test does it).
"""

import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = ["test_conformance.py", "test_pairings.py", "test_versions_pairings.py", "test_features.py",
         "test_large_results.py"]
MATRIX = re.compile(
    r"test_every_tool_through_the_recorder_answers_as_it_does_directly\[(?P<server>.+)-(?P<client>sdk-auto|sdk-legacy|typescript)\]"
)


def outcome(case) -> str:
    if case.find("failure") is not None or case.find("error") is not None:
        return "fail"
    return "skip" if case.find("skipped") is not None else "pass"


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="conformance-") as scratch:
        report = Path(scratch) / "report.xml"
        env = {**os.environ, "VAR_DIR": str(Path(scratch) / "var"), "REQUIRE_SERVICES": "1"}
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                f"--junitxml={report}",
                *(f"tests/journal/{name}" for name in FILES),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
        )
        rows = [(case.get("name"), outcome(case)) for case in ET.parse(report).getroot().iter("testcase")]
    matrix: dict[str, dict[str, str]] = {}
    others = []
    for name, result in rows:
        found = MATRIX.fullmatch(name)
        if found:
            matrix.setdefault(found["server"], {})[found["client"]] = result
        else:
            others.append((name, result))
    clients = ["sdk-auto", "sdk-legacy", "typescript"]
    print(f"  {'every tool of':<18}" + "".join(f"{client:>12}" for client in clients))
    for server, by_client in matrix.items():
        print(f"  {server:<18}" + "".join(f"{by_client.get(client, '-'):>12}" for client in clients))
    width = max(len(name) for name, _ in others)
    for name, result in others:
        print(f"  {name.removeprefix('test_'):<{width}}  {result}")
    passed = sum(result == "pass" for _, result in rows)
    print(f"pairings passed / total: {passed} / {len(rows)} "
          f"({len(matrix)} servers x {len(clients)} clients, every tool, plus {len(others)} other checks)")
    sys.exit(0 if passed == len(rows) else 1)


if __name__ == "__main__":
    main()
