"""What an undo recipe costs a call, and how much of the official servers it makes undoable (issue 23).

    .venv/bin/python bench/recipe_latency.py [--calls 200]

Starts the web app (Recorder included) on a scratch database, with the pinned official filesystem server
registered twice over stdio: `fs` with the filesystem recipe pack, `plainfs` without. One MCP client then
overwrites a file through each, interleaved call by call, and a direct stdio client times the read the
recipe makes (`read_text_file`). Prints the median latency of each, the recipe's added latency, and the
target (at most its two reads plus 20 %). Then, for the pinned filesystem, memory and git servers, lists
every write tool with how its pack classifies it, and the share that a plan can undo today. Needs Node and
the pinned npm servers (`make test` installs them).
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recorder_latency import client_for, sample_stack  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "tests" / "conformance" / "node_modules" / "@modelcontextprotocol"
BIN = Path(sys.executable).parent


def commands(world: Path) -> dict[str, str]:
    return {
        "filesystem": f"node {REFERENCE / 'server-filesystem/dist/index.js'} {world}",
        "memory": f"env MEMORY_FILE_PATH={world / 'memory.jsonl'} node "
                  f"{REFERENCE / 'server-memory/dist/index.js'}",
        "git": f"{BIN / 'mcp-server-git'} --repository {world}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()
    world = Path(tempfile.mkdtemp(prefix="recipe-bench-world-"))
    (world / "target.txt").write_text("before\n")
    with sample_stack("recipe-bench-", samples_port=8193, web_port=8194) as (_, user, token):
        import subprocess

        from approver import services as approver_services
        from journal import services
        from journal.undo import recipes

        subprocess.run(["git", "init", "-q", "-b", "main", str(world)], check=True)
        servers = {}
        for name, command in commands(world).items():
            servers[name] = services.refresh_catalogue(server=services.register_tool_server(
                name=name if name != "filesystem" else "fs", command=command))
            approver_services.use_pack(server=servers[name], pack=name, by=user)
        services.refresh_catalogue(server=services.register_tool_server(
            name="plainfs", command=commands(world)["filesystem"]))
        plain, recipe, reads = measure(token, world, args.calls, args.warmup)
        added = statistics.median(recipe) - statistics.median(plain)
        read = statistics.median(reads)
        print(f"{args.calls} write_file calls through the Recorder, interleaved ({args.warmup} warm-up)")
        print(f"  without a recipe: median {statistics.median(plain):7.2f} ms")
        print(f"  with the recipe:  median {statistics.median(recipe):7.2f} ms")
        print(f"  one read_text_file, directly over stdio: median {read:.2f} ms")
        target = 2 * read * 1.2
        print(f"  added by the recipe: {added:.2f} ms; target at most two reads + 20 %: {target:.2f} ms -> "
              f"{'met' if added <= target else 'NOT met'}")
        print()
        undoable = total = 0
        for name, server in servers.items():
            for tool in server.catalogue:
                if (tool.get("annotations") or {}).get("readOnlyHint") is True:
                    continue
                kind, why = recipes.explain(tool, server.recipe(tool["name"]), server.catalogue)
                total += 1
                undoable += kind == "compensate"
                print(f"  {name:<10} {tool['name']:<22} {kind:<11} {why}")
        print(f"undoable write tools of the pinned official servers: {undoable} of {total} "
              f"({100 * undoable / total:.0f} %)")


def measure(token: str, world: Path, calls: int, warmup: int):
    import anyio
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    url = "http://127.0.0.1:8194/mcp/"
    target = str(world / "target.txt")

    async def call(client, tool, arguments) -> float:
        started = time.perf_counter()
        result = await client.call_tool(tool, arguments)
        assert not result.is_error, result
        return (time.perf_counter() - started) * 1000

    async def main():
        plain, recipe, reads = [], [], []
        script = str(REFERENCE / "server-filesystem/dist/index.js")
        node = StdioServerParameters(command="node", args=[script, str(world)])
        async with client_for(url, token) as through, Client(stdio_client(node)) as direct:
            for i in range(warmup + calls):
                times = (await call(through, "plainfs__write_file", {"path": target, "content": f"p{i}\n"}),
                         await call(through, "fs__write_file", {"path": target, "content": f"r{i}\n"}),
                         await call(direct, "read_text_file", {"path": target}))
                if i >= warmup:
                    for kept, value in zip((plain, recipe, reads), times, strict=True):
                        kept.append(value)
        return plain, recipe, reads

    return anyio.run(main)


if __name__ == "__main__":
    main()
