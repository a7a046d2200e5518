"""What any Recorder costs before it journals anything: the floor under `recorder_latency.py`.

    .venv/bin/python bench/relay_floors.py [--calls 1000]

Measures, from one MCP client, calls to a sample tool directly and through three relays, each in its own
process: the MCP SDK's server with the SDK's client upstream (no journal); a minimal hand-written JSON-RPC
relay over streamable HTTP (no journal); and the same minimal relay writing two tiny raw-SQL transactions
per call (the intent, then the outcome with two chain entries), which is the least any durable
intent-before-call journal can do here. Prints median latencies and their ratio to the direct call.
"""

import argparse
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

UPSTREAM = "http://127.0.0.1:8190/legacy/mcp"
HEADERS = {"accept": "application/json, text/event-stream", "mcp-protocol-version": "2026-07-28",
           "mcp-method": "tools/call"}


def lean_app(journal: bool):
    import httpx2

    from journal.mcp.asgi import read_body

    state = {}
    if journal:
        from asgiref.sync import sync_to_async
        from django.contrib.auth.models import User
        from django.db import connection, transaction

        from journal import services
        from journal.models import Run

        agent, _ = services.create_agent(name="floor", on_behalf_of=User.objects.create_user("floor"))
        run = Run.objects.create(agent=agent, key="floor")

        def intent(name, arguments):
            with connection.cursor() as cursor:
                cursor.execute(
                    "INSERT INTO journal_step (run_id, number, server_name, tool, arguments, status, "
                    "is_error,"
                    " error_message, failure_class, started_at, declaration, declaration_source, "
                    "reversibility,"
                    " undo_problems, effect_summary, effect_resource, effect_version, compensation_token,"
                    " receipt_problem) VALUES (%s, %s, 'legacy', %s, %s, 'pending', false, '', '', %s, '{}', "
                    "'',"
                    " 'unknown', '[]', '', '', '', '', '')",
                    [
                        run.pk,
                        10**6 + state.setdefault("n", 0),
                        name,
                        json.dumps(arguments),
                        "2026-11-29 10:00:00",
                    ],
                )
                state["n"] += 1
                return cursor.lastrowid

        def outcome(step_id, result):
            import rfc8785

            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT head_seq, head_hash FROM journal_run WHERE id = %s", [run.pk])
                seq, head = cursor.fetchone()
                rows = []
                for event in ("call", "result"):
                    seq += 1
                    body = {"seq": seq, "ts": "2026-11-29T10:00:00.000000Z", "event": event, "data": result,
                            "prevHash": head}
                    head = hashlib.sha256(rfc8785.dumps(body)).hexdigest()
                    rows.append([run.pk, seq, body["ts"], event, json.dumps(result), body["prevHash"], head])
                cursor.executemany(
                    "INSERT INTO journal_chainentry (run_id, seq, ts, event, data, prev_hash, hash)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s)",
                    rows,
                )
                cursor.execute("UPDATE journal_step SET status = 'ok', result = %s WHERE id = %s",
                               [json.dumps(result), step_id])
                cursor.execute(
                    "UPDATE journal_run SET head_seq = %s, head_hash = %s WHERE id = %s", [seq, head, run.pk]
                )

        state["intent"], state["outcome"] = sync_to_async(intent), sync_to_async(outcome)

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    state["http"] = httpx2.AsyncClient(timeout=10)
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["method"] != "POST":
            await send({"type": "http.response.start", "status": 405, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        request = json.loads(await read_body(receive))
        method = request.get("method")
        if method == "server/discover":
            result = {"cacheScope": "private", "capabilities": {"tools": {"listChanged": False}},
                      "resultType": "complete", "supportedVersions": ["2026-07-28"], "ttlMs": 0}
        elif method == "tools/list":
            result = {"tools": [{"name": "legacy__echo", "inputSchema": {"type": "object"}}],
                      "resultType": "complete", "ttlMs": 0, "cacheScope": "private"}
        else:
            params = request["params"]
            name = params["name"].split("__", 1)[1]
            step_id = await state["intent"](name, params.get("arguments", {})) if journal else None
            forwarded = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {
                    "name": name,
                    "arguments": params.get("arguments", {}),
                    "_meta": params.get("_meta", {}),
                },
            }
            response = await state["http"].post(
                UPSTREAM, json=forwarded, headers={**HEADERS, "mcp-name": name}
            )
            result = response.json()["result"]
            if journal:
                await state["outcome"](step_id, result)
        out = json.dumps({"jsonrpc": "2.0", "id": request.get("id"), "result": result}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(out)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": out})

    return app


def sdk_app():
    import mcp_types as types
    from mcp.server.lowlevel import Server
    from mcp.server.transport_security import TransportSecuritySettings

    from journal.upstream.client import Endpoint, Upstreams

    upstreams = Upstreams(timeout=10)

    async def list_tools(ctx, params):
        return types.ListToolsResult(tools=[types.Tool(name="legacy__echo", input_schema={"type": "object"})])

    async def call_tool(ctx, params):
        return await upstreams.call_tool(
            Endpoint("legacy", "http", UPSTREAM), "echo", dict(params.arguments or {})
        )

    app = Server("floor", on_list_tools=list_tools, on_call_tool=call_tool).streamable_http_app(
        streamable_http_path="/mcp/", json_response=True,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(application):
        async with upstreams, inner(application):
            yield

    app.router.lifespan_context = lifespan
    return app


def serve(kind: str, port: int) -> None:
    import uvicorn

    if kind == "lean-journal":
        import django
        from django.core.management import call_command

        django.setup()
        call_command("migrate", verbosity=0)
    app = sdk_app() if kind == "sdk" else lean_app(journal=kind == "lean-journal")
    uvicorn.run(app, port=port, log_level="warning")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve(args.serve, args.port)

    from recorder_latency import measure, summary, wait

    scratch = Path(tempfile.mkdtemp(prefix="relay-floors-"))
    env = {**os.environ, "VAR_DIR": str(scratch), "RECORDER_KEY_DIR": str(scratch / "keys"),
           "DJANGO_SETTINGS_MODULE": "approver.settings", "LOG_LEVEL": "WARNING"}
    env.pop("DATABASE_URL", None)
    processes = [subprocess.Popen([sys.executable, "-m", "samples", "--port", "8190"], cwd=ROOT, env=env)]
    relays = {"sdk": 8195, "lean": 8196, "lean-journal": 8197}
    for kind, port in relays.items():
        processes.append(subprocess.Popen([sys.executable, __file__, "--serve", kind, "--port", str(port)],
                                          cwd=ROOT, env=env))
    try:
        wait("http://127.0.0.1:8190/legacy/ledger")
        for port in relays.values():
            wait(f"http://127.0.0.1:{port}/")
        direct = summary(measure(UPSTREAM, None, args.calls, 50))[0]
        print(f"{args.calls} calls to legacy echo from one MCP client; median latency")
        print(f"  direct:                                        {direct:6.2f} ms")
        labels = {"sdk": "SDK server + SDK client, no journal:",
                  "lean": "minimal JSON-RPC relay, no journal:",
                  "lean-journal": "minimal relay + two raw-SQL transactions:"}
        for kind, port in relays.items():
            through = summary(measure(f"http://127.0.0.1:{port}/mcp/", "agt_floor", args.calls, 50))[0]
            print(f"  {labels[kind]:<46}{through:6.2f} ms   {through / direct:4.2f}x")
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=20)


if __name__ == "__main__":
    main()
