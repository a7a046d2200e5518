"""The conformance matrix: every pairing the Recorder is checked on, and how many pass.

    .venv/bin/python bench/conformance.py

Runs the conformance tests: tests/journal/test_conformance.py (every tool of server-everything over stdio
and streamable HTTP, server-memory, server-filesystem, mcp-server-time, mcp-server-git and mcp-server-fetch,
with the `mcp` SDK's client in both modes and the TypeScript SDK's client, each compared with a direct
call), test_pairings.py (protocol pairings, verbatim errors, progress, cancellation, input_required),
test_versions_pairings.py (agents and servers on 2025-03-26, 2025-06-18 and 2025-11-25), test_features.py
(resources, prompts, completion, logging, elicitation, sampling, roots), test_large_results.py (5 MB
results from every kind of server to both client modes, and answers over the limit), test_python_clients.py
(the fastmcp client, LangChain's MCP adapters and pydantic-ai's toolset, feature by feature against
server-everything), test_task_calls.py (the tasks extension against fastmcp-tasks) and
test_conformance_suite.py (the official MCP conformance suite's server scenarios directly and through the
Recorder, and its client scenarios with the Recorder as the client). Prints the matrix of
servers by clients, the Python clients by feature, one line per other check, and "pairings passed / total".
Needs Node and the pinned npm packages and Python client environments (make test installs them).
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = ["test_conformance.py", "test_pairings.py", "test_versions_pairings.py", "test_features.py",
         "test_large_results.py", "test_python_clients.py", "test_task_calls.py", "test_conformance_suite.py"]
PYTHON_CLIENT = re.compile(
    r"test_a_python_client_gets_through_the_recorder_what_it_gets_directly\[(?P<client>.+)\]"
)
ALL_FEATURES = ("tools", "call", "error", "resources", "read", "prompt", "progress", "elicitation",
                "sampling")
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
        cases = list(ET.parse(report).getroot().iter("testcase"))
        rows = [(case.get("name"), outcome(case)) for case in cases]
        features = {case.get("name"): (prop.get("value") or "").split(",") for case in cases
                    for prop in case.iter("property") if prop.get("name") == "features"}
        suite = {case.get("name"): json.loads(prop.get("value") or "{}") for case in cases
                 for prop in case.iter("property") if prop.get("name") == "scenarios"}
    matrix: dict[str, dict[str, str]] = {}
    python_clients: dict[str, dict[str, str]] = {}
    others = []
    for name, result in rows:
        found, client = MATRIX.fullmatch(name), PYTHON_CLIENT.fullmatch(name)
        if found:
            matrix.setdefault(found["server"], {})[found["client"]] = result
        elif client:
            python_clients[client["client"]] = {f: result for f in features.get(name, ALL_FEATURES)}
        else:
            others.append((name, result))
    clients = ["sdk-auto", "sdk-legacy", "typescript"]
    print(f"  {'every tool of':<18}" + "".join(f"{client:>12}" for client in clients))
    for server, by_client in matrix.items():
        print(f"  {server:<18}" + "".join(f"{by_client.get(client, '-'):>12}" for client in clients))
    print(f"\n  {'server-everything':<18}" + "".join(f"{feature:>12}" for feature in ALL_FEATURES))
    for client, by_feature in python_clients.items():
        print(f"  {client:<18}" + "".join(f"{by_feature.get(f, 'n/a'):>12}" for f in ALL_FEATURES))
    print()
    for name, scored in suite.items():
        direct, through = scored.get("direct", {}), scored.get("through", {})
        if all(isinstance(v, dict) for v in direct.values()):  # the server scenarios, each scored
            passing = [s for s in direct
                       if not direct[s].get("FAILURE") and not through.get(s, {}).get("FAILURE")]
            print(f"  conformance suite, server scenarios passing directly and through the Recorder: "
                  f"{len(passing)} / {len(direct)}")
        else:
            scenario = name.split("[")[-1].rstrip("]")
            print(f"  conformance suite, client scenario {scenario}: directly {direct}, through {through}")
    print()
    width = max(len(name) for name, _ in others)
    for name, result in others:
        print(f"  {name.removeprefix('test_'):<{width}}  {result}")
    passed = sum(result == "pass" for _, result in rows)
    print(f"pairings passed / total: {passed} / {len(rows)} "
          f"({len(matrix)} servers x {len(clients)} clients, every tool; {len(python_clients)} Python "
          f"clients, every feature each has; plus {len(others)} other checks)")
    sys.exit(0 if passed == len(rows) else 1)


if __name__ == "__main__":
    main()
