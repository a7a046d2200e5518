"""How a call to a tool server failed: one error type that says how the failure should be treated (its
MCP-Rescue failure class, whether repeating could help, whether the server may have acted), and the mapping
from whatever the SDK or the transport raised to it."""

from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import anyio
import httpx2 as httpx  # the HTTP library the mcp SDK itself uses
from mcp import MCPError
from pydantic import ValidationError

from ..record import strict_json


class ToolServerError(Exception):
    """A call that did not produce a tool result.

    `failure_class` is one of MCP-Rescue's categories; `transient` failures may succeed if repeated;
    `may_have_acted` is true when the request left us but no answer came back, so the server may have
    done the work (a timeout after sending): such a call must never be repeated blindly. `rpc` is a JSON-RPC
    error exactly as the server sent it (code, message and data), for whoever relays it.
    """

    def __init__(
        self,
        message: str,
        *,
        failure_class: str,
        transient: bool = False,
        may_have_acted: bool = False,
        code: int | None = None,
        rpc: dict[str, Any] | None = None,
        oversized: Any = None,
        retry_after: float | None = None,
        timed_out: bool = False,
    ):
        super().__init__(message)
        self.message = message
        self.failure_class = failure_class
        self.transient = transient
        self.may_have_acted = may_have_acted
        self.code = code
        self.rpc = rpc
        self.oversized = oversized  # a `bounded.Oversized`: the server answered, over the Recorder's limit
        self.retry_after = retry_after  # seconds, when the server said when to come back (HTTP Retry-After)
        self.timed_out = timed_out  # no answer within the Recorder's timeout


def too_large(server: str, oversized) -> ToolServerError:
    """The server answered, with more than the Recorder relays: it acted, and what it sent is known only by
    its size and digest."""
    if oversized.depth:
        what = (
            f"{oversized.size} bytes of JSON nested {oversized.depth} levels deep, deeper than the "
            f"Recorder's "
            f"limit of {strict_json.MESSAGE_MAX_DEPTH}"
        )
    else:
        what = (f"{oversized.size} bytes, over the Recorder's limit of {oversized.limit} bytes "
                "(RECORDER_MAX_RESULT_BYTES)")
    return ToolServerError(
        f"{server} answered with {what}, so its answer was not relayed (SHA-256 {oversized.sha256})",
        failure_class="unknown",
        may_have_acted=True,
        oversized=oversized,
    )


# JSON-RPC codes from the MCP spec and JSON-RPC 2.0.
_RPC_CLASSES = {
    -32600: "invalid_arguments",
    -32601: "not_found",
    -32602: "invalid_arguments",
    -32603: "unknown",
    -32001: "transient",  # request timeout (SDK)
    -32021: "unsupported",  # a capability the client did not declare (2026-07-28)
    -32022: "unsupported",  # a protocol version the server does not speak (2026-07-28)
}


def classify_rpc_error(code: int) -> str:
    return _RPC_CLASSES.get(code, "unknown")


def http_status_class(status: int) -> tuple[str, bool]:
    if status == 401:
        return "authentication", False
    if status == 403:
        return "permission", False
    if status == 404:
        return "not_found", False
    if status == 409:
        return "conflict", False
    if status in (501, 505):  # not implemented, or not on this HTTP or protocol version: no passing outage
        return "unsupported", False
    if status in (408, 429) or status >= 500:
        return "transient", True
    return "invalid_arguments", False


MAX_RETRY_AFTER = (
    3600.0  # a server's Retry-After is advice passed on to the agent: capped, never trusted blindly
)


def retry_after_seconds(value: str | None) -> float | None:
    """An HTTP Retry-After header (RFC 9110: seconds, or an HTTP date) as seconds from now, or None."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), MAX_RETRY_AFTER)
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:
        return None
    return min(max((moment - datetime.now(UTC)).total_seconds(), 0.0), MAX_RETRY_AFTER)


def _leaf_exceptions(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        leaves = []
        for inner in exc.exceptions:
            leaves.extend(_leaf_exceptions(inner))
        return leaves
    return [exc]


def first_leaf(exc: BaseException) -> BaseException:
    leaves = _leaf_exceptions(exc)
    return leaves[0] if leaves else exc


def translate(exc: BaseException, *, server: str, sent: bool) -> ToolServerError:
    """Map whatever the SDK or the transport raised to one ToolServerError."""
    for leaf in _leaf_exceptions(exc):
        cause = leaf
        while cause is not None:
            if isinstance(cause, ToolServerError):
                return cause
            if isinstance(cause, httpx.HTTPStatusError):
                failure_class, transient = http_status_class(cause.response.status_code)
                return ToolServerError(
                    f"{server} answered HTTP {cause.response.status_code}",
                    failure_class=failure_class, transient=transient,
                    may_have_acted=sent and cause.response.status_code >= 500,
                    retry_after=retry_after_seconds(cause.response.headers.get("retry-after")),
                )
            if isinstance(cause, httpx.ConnectError | ConnectionRefusedError):
                return ToolServerError(
                    f"{server} refused the connection", failure_class="transient", transient=True
                )
            if isinstance(cause, TimeoutError | httpx.TimeoutException):
                return ToolServerError(
                    f"{server} did not answer in time",
                    failure_class="transient",
                    transient=True,
                    may_have_acted=sent,
                    timed_out=True,
                )
            if isinstance(cause, MCPError):
                code = cause.error.code
                failure_class = classify_rpc_error(code)
                if code == -32700:
                    # Raised by our own client when the server's answer is not JSON-RPC: the server's fault,
                    # not the agent's, so it must not be relayed as a parse error of the agent's request.
                    return ToolServerError(
                        f"{server} answered with something that is not valid MCP", failure_class="unknown",
                        may_have_acted=sent,
                    )
                if code == -32001:
                    return ToolServerError(
                        f"{server} did not answer in time", failure_class="transient", transient=True,
                        may_have_acted=sent, code=code, timed_out=True,
                    )
                return ToolServerError(
                    f"{server} answered with JSON-RPC error {code}: {cause.error.message}",
                    failure_class=failure_class, transient=False, code=code,
                    rpc=cause.error.model_dump(mode="json", by_alias=True, exclude_none=True),
                )
            if isinstance(cause, ValidationError):
                return ToolServerError(
                    f"{server} answered with something that is not a valid MCP result",
                    failure_class="unknown", may_have_acted=sent,
                )
            if isinstance(
                cause, httpx.TransportError | OSError | anyio.BrokenResourceError | anyio.ClosedResourceError
            ):
                return ToolServerError(
                    f"{server} connection failed: {type(cause).__name__}", failure_class="transient",
                    transient=True, may_have_acted=sent,
                )
            cause = cause.__cause__ or cause.__context__
    return ToolServerError(
        f"{server} failed: {type(exc).__name__}: {exc}", failure_class="unknown", may_have_acted=sent
    )
