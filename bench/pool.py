"""What psycopg's connection pool (`DATABASE_POOL`) saves a request on PostgreSQL.

    .venv/bin/python bench/pool.py --postgres URL [--requests 500]

Starts the stack of bench/recorder_latency.py on a scratch database on that server, with two web app
processes: one as configured by default (each request opens its database connection and closes it at its
end, `DATABASE_CONN_MAX_AGE=0`), one with `DATABASE_POOL=4` (psycopg's pool: a request takes an open
connection). Then, interleaved, N requests to each one's runs page, signed in (the session, the user, the
runs read and the page drawn), and N tool calls through each one's Recorder (whose journal keeps its own
connection, so the pool should change nothing there). Prints each one's median and p99.
"""

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from recorder_latency import client_for, sample_stack, summary  # noqa: E402
from sessions import scratch_postgres  # noqa: E402

PORTS = {"no pool (a connection a request)": 8197, "DATABASE_POOL=4": 8198}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", metavar="URL", required=True)
    parser.add_argument("--requests", type=int, default=500)
    args = parser.parse_args()
    with scratch_postgres(args.postgres) as database_url, sample_stack(
            "bench-pool-", samples_port=8196, web_port=PORTS["no pool (a connection a request)"],
            database_url=database_url, more_webs=((PORTS["DATABASE_POOL=4"], {"DATABASE_POOL": "4"}),),
    ) as (_, user, token):
        from django.contrib.auth.models import Group
        from django.contrib.sessions.backends.db import SessionStore

        from journal.auth import roles

        user.groups.add(Group.objects.get_or_create(name=roles.ON_CALL)[0])  # a reader of the runs page
        session = SessionStore()
        session.update({"_auth_user_id": str(user.pk), "_auth_user_hash": user.get_session_auth_hash(),
                        "_auth_user_backend": "django.contrib.auth.backends.ModelBackend"})
        session.create()
        pages, calls = measure(token, session.session_key, args.requests)
    print(f"{args.requests} requests of each kind to each web process, interleaved, on PostgreSQL:")
    for name in PORTS:
        (page, page_p99), (call, call_p99) = summary(pages[name]), summary(calls[name])
        print(f"  {name:<34} runs page median {page:6.2f} ms (p99 {page_p99:6.2f}); "
              f"tool call median {call:6.2f} ms (p99 {call_p99:6.2f})")


def measure(token: str, session_key: str, requests: int) -> tuple[dict, dict]:
    import anyio
    import httpx

    pages = {name: [] for name in PORTS}
    calls = {name: [] for name in PORTS}

    first, second = (f"http://127.0.0.1:{port}/mcp/" for port in PORTS.values())

    async def run():
        async with httpx.AsyncClient(cookies={"sessionid": session_key}, timeout=30) as http, \
                client_for(first, token) as a, client_for(second, token) as b:
            clients = dict(zip(PORTS, (a, b), strict=True))
            for n in range(requests + 20):  # the first 20 warm up
                for name, port in PORTS.items():
                    started = time.perf_counter()
                    response = await http.get(f"http://127.0.0.1:{port}/runs/")
                    assert response.status_code == 200, response.status_code
                    if n >= 20:
                        pages[name].append((time.perf_counter() - started) * 1000)
                    started = time.perf_counter()
                    result = await clients[name].call_tool("legacy__echo", {"i": n})
                    assert not result.is_error, result
                    if n >= 20:
                        calls[name].append((time.perf_counter() - started) * 1000)

    anyio.run(run)
    return pages, calls


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
