"""The MCP conformance suite's client command when the client under test is not a program it can start (the
Recorder, inside the test's process): `python hand_over.py DIR SERVER_URL` writes SERVER_URL to DIR/url, then
waits until DIR/done exists (the test has run the client against the URL) and exits."""

import sys
import time
from pathlib import Path

folder, url = Path(sys.argv[1]), sys.argv[-1]
(folder / "url").write_text(url)
deadline = time.monotonic() + 120
while not (folder / "done").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
