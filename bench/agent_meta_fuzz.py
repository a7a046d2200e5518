"""Every shape of the agent-controlled parts of a call, at a large size: the Hypothesis tests of
tests/journal/test_agent_meta.py with AGENT_META_EXAMPLES calls (default 5,000; CI runs 500): `_meta` and
`hatp/journal` of any shape, progress tokens up to a megabyte, the tasks extension declared or garbled,
texts with U+0000 and lone surrogates, and task handles an agent makes up (a fifth as many).

    .venv/bin/python bench/agent_meta_fuzz.py [--examples 5000]

Prints how many calls were made, how many were journaled with their outcome and how many were refused
before anything was journaled or sent, and the time it took; it fails if any call that reached a server was
left without its outcome.
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=5000)
    args = parser.parse_args()
    env = {**os.environ, "AGENT_META_EXAMPLES": str(args.examples),
           "VAR_DIR": os.environ.get("VAR_DIR", str(ROOT / "var" / "bench-agent-meta"))}
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
         "tests/journal/test_agent_meta.py::"
         "test_every_call_an_agent_can_shape_that_reached_a_server_ends_journaled_with_its_outcome",
         "tests/journal/test_agent_meta.py::"
         "test_a_task_handle_an_agent_makes_up_gets_a_clear_error_and_changes_nothing"],
        cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - started
    lines = [line for line in result.stdout.splitlines()
             if "agent-controlled calls" in line or "passed" in line or "failed" in line]
    print("\n".join(lines) or result.stdout[-2000:])
    verdict = "every call journaled" if result.returncode == 0 else "FAILED"
    print(f"{args.examples} examples in {seconds:.0f} s; {verdict}")
    sys.exit(result.returncode)
