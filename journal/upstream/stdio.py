"""A tool server's process over stdio, with every line it writes bounded.

The SDK's stdio client reads each line whole before parsing it, so a 150 MB answer is held (and parsed)
whole. This is the same transport (the SDK's own process start and shutdown), except that a line over the
limit is read to its end, hashed and dropped as it arrives, and replaced by a JSON-RPC error for the request
it answered, carrying a token only this process issued (`bounded.Tokens`), exactly as `BoundedTransport`
does over HTTP. Which request it answered is read from the line's first or last bytes: a JSON-RPC answer
begins with its `id` (the Python SDK's servers) or ends with it (the TypeScript SDK's). An oversized line
that says neither is dropped, and its request times out.
"""

import contextlib
import json
import logging
import re
import sys
from typing import Any

import anyio
import anyio.lowlevel
from mcp.client.stdio import StdioServerParameters, get_default_environment

from .. import sdk
from .bounded import CHUNK, Tokens, _Measure, too_deep

logger = logging.getLogger(__name__)

_EDGE = 512  # bytes kept of an oversized line's start and end, to find its id
_ID = r'(-?\d+|"(?:[^"\\]|\\.)*")'
_LEADING_ID = re.compile(rb'^\s*\{\s*"jsonrpc"\s*:\s*"2\.0"\s*,\s*"id"\s*:\s*' + _ID.encode())
_TRAILING_ID = re.compile(rb'[,{]\s*"id"\s*:\s*' + _ID.encode() + rb'\s*\}\s*$')


def answered_id(head: bytes, tail: bytes) -> Any:
    """The id of the JSON-RPC answer whose first and last bytes these are, or None."""
    found = _LEADING_ID.match(head) or _TRAILING_ID.search(tail)
    if found is None:
        return None
    try:
        return json.loads(found.group(1))
    except ValueError:
        return None


class _Lines:
    """Splits the server's output into lines, each within `limit` bytes or measured instead."""

    def __init__(self, limit: int, tokens: Tokens):
        self.limit, self.tokens = limit, tokens
        self.pending = bytearray()
        self.measure: _Measure | None = None
        self.head = b""
        self.tail = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        lines = []
        while chunk:
            end = chunk.find(b"\n")
            part, chunk = (chunk, b"") if end < 0 else (chunk[:end], chunk[end + 1:])
            if self.measure is None:
                self.pending += part
                if len(self.pending) > self.limit:
                    self.measure = _Measure(self.limit)
                    self.head = bytes(self.pending[:_EDGE])
                    self.measure.add(bytes(self.pending))
                    self.tail = bytes(self.pending[-_EDGE:])
                    self.pending.clear()
            else:
                self.measure.add(part)
                self.tail = (self.tail + part)[-_EDGE:]
            if end >= 0:
                lines.append(self._line())
        return [line for line in lines if line]

    def _line(self) -> bytes:
        if self.measure is None:
            line = bytes(self.pending)
            self.pending.clear()
            oversized = too_deep(line, self.limit)
            if oversized is None:
                return line
            self.head, self.tail = line[:_EDGE], line[-_EDGE:]
        else:
            oversized, self.measure = self.measure.oversized(), None
        request_id = answered_id(self.head, self.tail)
        if request_id is None:
            logger.warning(
                "a stdio server wrote a line of %s, answering no request it names; dropped", oversized
            )
            return b""
        return self.tokens.replacement(request_id, oversized)


def _errlog():
    """Where the server's own stderr goes: this process's, or its original one when `sys.stderr` is not a
    file (a Celery worker's is a logging proxy, with no file descriptor a child process could write to)."""
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return sys.__stderr__
    return sys.stderr


@contextlib.asynccontextmanager
async def bounded_stdio_client(server: StdioServerParameters, limit: int, tokens: Tokens):
    """The SDK's `stdio_client`, reading lines of at most `limit` bytes (see the module)."""
    process = await sdk.create_process(
        command=server.command, args=server.args, env=get_default_environment() | (server.env or {}),
        errlog=_errlog(), cwd=server.cwd)
    read_writer, read_stream = anyio.create_memory_object_stream(0)
    write_stream, write_reader = anyio.create_memory_object_stream(0)
    writer_done = anyio.Event()

    async def stdout_reader() -> None:
        lines = _Lines(limit, tokens)
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream,
                                 ConnectionError):
            async with read_writer:
                try:
                    while True:
                        chunk = await process.stdout.receive(CHUNK)
                        for line in lines.feed(chunk):
                            await read_writer.send(sdk.parse_line(line.decode("utf-8", "replace")))
                finally:
                    await sdk.drain_stdout(process)

    async def stdin_writer() -> None:
        try:
            async with write_reader:
                async for session_message in write_reader:
                    data = session_message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    await process.stdin.send(data.encode())
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_writer.aclose()
        finally:
            writer_done.set()

    async with anyio.create_task_group() as group:
        group.start_soon(stdout_reader)
        group.start_soon(stdin_writer)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):  # the process is stopped even when the caller is cancelled
                read_stream.close()
                write_stream.close()
                with anyio.move_on_after(2.0):
                    await writer_done.wait()
                await sdk.stop_process(process)
                for stream in (read_stream, write_stream, read_writer, write_reader):
                    await stream.aclose()
                await anyio.lowlevel.checkpoint()
            group.cancel_scope.cancel()
