import argparse
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
    args = parser.parse_args()
    app, _ = build_app(args.state)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
