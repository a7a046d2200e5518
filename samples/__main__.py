import argparse
import os
from pathlib import Path

import uvicorn

from .app import build_app


def main() -> None:
    parser = argparse.ArgumentParser(description="Run the sample tool servers.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument(
        "--state", type=Path, default=None, help="Folder for state and keys (default: in memory)."
    )
    parser.add_argument(
        "--workers", type=int, default=1,
        help="Processes (uvicorn --workers). Each keeps its own copy of the state, read from --state as it "
        "starts: for reads and checks of a state written before (a benchmark's checks), not for writes.",
    )
    parser.add_argument(
        "--delay-ms", type=int, default=0,
        help="Every server waits this long before each call, from the start (as /control's delay_ms, which "
        "reaches only the one process that answers it).",
    )
    args = parser.parse_args()
    if args.workers == 1:
        app = _built(args.state, args.delay_ms)
    else:  # each worker process builds its own app from these
        os.environ["SAMPLES_STATE"] = str(args.state) if args.state else ""
        os.environ["SAMPLES_DELAY_MS"] = str(args.delay_ms)
        app = "samples.__main__:from_environment"
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", workers=args.workers,
                factory=args.workers > 1)


def from_environment():
    """The app of one of several worker processes (`--workers`)."""
    state = os.environ.get("SAMPLES_STATE", "")
    return _built(Path(state) if state else None, int(os.environ.get("SAMPLES_DELAY_MS", "0")))


def _built(state: Path | None, delay_ms: int):
    app, servers = build_app(state)
    for server in servers.values():
        server.delay_ms = delay_ms
    return app


if __name__ == "__main__":
    main()
