"""An agent's call as the people who run the Recorder see it: one span in the OpenTelemetry MCP semantic
conventions (`tools/call server__tool`, a SERVER span, the child of the agent's own trace when its `_meta`
carries one), one count in `undo_tool_calls` by server, tool, outcome and decision, and its duration, each
taken from what the Recorder itself decided and answered (the gateway marks each as it happens: `held`,
`refused`, `upstream_failed`, …), and ended once the answer's journal write has committed."""

import contextlib
import contextvars
import logging
import time

import anyio
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from . import logs, metrics, tracing

logger = logging.getLogger(__name__)
_CURRENT: contextvars.ContextVar["ObservedCall | None"] = contextvars.ContextVar("undo_call", default=None)
UNLISTED = "(unlisted)"  # a tool the server does not list: labels stay bounded whatever an agent sends


def current() -> "ObservedCall | _Unobserved":
    """The call being observed here, or one that records nothing (a task's call resumed after a restart)."""
    return _CURRENT.get() or _UNOBSERVED


class ObservedCall:
    """One agent's `tools/call`, from its request to its journaled answer. Use as a context manager around
    the work: the span is current inside it (the upstream call's span is its child), and what the gateway
    marks decides the outcome. `end` (called once the answer's journal write has committed) counts it."""

    __slots__ = ("name", "server", "tool", "outcome", "decision", "error", "started", "span", "_tokens",
                 "_ended", "_owned")

    def __init__(self, name: str, *, agent: str, session_id: str | None, request_id, version: str, meta,
                 adopt: bool = False):
        """`adopt`: the request's SERVER span is already open (the `mcp` SDK's own, on the path it answers):
        it is given the Recorder's attributes instead of a second one."""
        self.name, self.server, self.tool = name, "", ""
        self.outcome, self.decision, self.error = "", "none", ""
        self.started = time.perf_counter()
        self._tokens: tuple = ()
        self._ended, self._owned = False, True
        self.span = None
        current = trace.get_current_span() if adopt and tracing.on() else None
        if current is not None and current.is_recording():
            self.span, self._owned = current, False
            current.set_attributes({"undo.agent": agent,
                                    **({"mcp.session.id": session_id} if session_id else {})})
        elif tracing.on():
            attributes = {"mcp.method.name": "tools/call", "gen_ai.operation.name": "execute_tool",
                          "gen_ai.tool.name": name, "mcp.protocol.version": version, "undo.agent": agent,
                          "network.transport": "tcp"}
            if session_id:
                attributes["mcp.session.id"] = session_id
            if request_id is not None:
                attributes["jsonrpc.request.id"] = str(request_id)
            self.span = tracing.TRACER.start_span(f"tools/call {name}", context=tracing.parent_from(meta),
                                                  kind=SpanKind.SERVER, attributes=attributes)
        logs.bind(agent=agent)

    def __enter__(self) -> "ObservedCall":
        token = _CURRENT.set(self)
        if self.span is not None:
            self._tokens = (token, trace.use_span(self.span, end_on_exit=False))
            self._tokens[1].__enter__()
        else:
            self._tokens = (token, None)
        return self

    def __exit__(self, kind, error, tb) -> None:
        token, used = self._tokens
        if used is not None:
            used.__exit__(kind, error, tb)
        _CURRENT.reset(token)

    # What the gateway marks, as it happens.
    def opened(self, opened) -> None:
        """The call's step is journaled: its server, tool (bounded to what the server lists), run and step."""
        server = opened.server
        self.server = server.name
        self.tool = opened.tool if opened.tool in server.listed_tool_names else UNLISTED
        self.decision = (opened.policy or {}).get("decision", "allow")
        logs.bind(run=opened.run_public, step=opened.number)
        if self.span is not None:
            self.span.set_attributes({"undo.server": server.name, "undo.policy.decision": self.decision,
                                      "undo.run.id": opened.run_public, "undo.step": opened.number})

    def mark(self, outcome: str, error: str = "") -> None:
        """How the call ended, as the agent hears it (one of `metrics.OUTCOMES`), and its `error.type` when
        it is not a tool result (a JSON-RPC error's code, an exception's type)."""
        self.outcome, self.error = outcome, error or self.error

    def upstream_failed(self, exc) -> None:
        """The server did not give a tool result (`ToolServerError`): the agent hears it as a tool error,
        except a JSON-RPC error, which it hears as the same JSON-RPC error."""
        if getattr(exc, "timed_out", False):
            self.mark("timeout")
        elif exc.code is not None and exc.failure_class != "transient":
            self.mark("jsonrpc_error", str(exc.code))
        else:
            self.mark("failed")

    def after_hold(self, refusal: tuple) -> None:
        """A held call's wait ended without sending it: held if the agent was told it still waits for
        approval, else (denied, lapsed, too many waiting) refused, as `answered` counts it."""
        if still_held(refusal):
            self.mark("held")

    def failed_with(self, exc: BaseException) -> None:
        """The call ended in an exception: the agent's cancel, a JSON-RPC error, or the Recorder's own."""
        if self.outcome:
            return
        code = getattr(getattr(exc, "error", None), "code", None)
        if isinstance(exc, anyio.get_cancelled_exc_class()) or code == -32800:
            self.mark("cancelled", "cancelled")
        elif isinstance(code, int):
            self.mark("jsonrpc_error", str(code))
        else:
            self.mark("failed", type(exc).__name__)

    def answered(self, result, *, own_error: bool) -> None:
        """The answer the agent gets, unless something more precise was marked: a tool error of the
        Recorder's own (`own_error`) is a refusal, the server's a tool error."""
        failed = own_error or (isinstance(result, dict) and result.get("isError") is True)
        if failed and not self.error:
            self.error = "tool_error"  # the conventions' error.type for a result with isError
        if self.outcome:
            return
        if own_error:
            self.mark("refused")
        elif failed:
            self.mark("tool_error")
        else:
            self.mark("ok")

    def end(self) -> None:
        """Count the call and end its span (once)."""
        if self._ended:
            return
        self._ended = True
        outcome = self.outcome or "failed"
        seconds = time.perf_counter() - self.started
        metrics.TOOL_CALLS.labels(self.server, self.tool, outcome, self.decision).inc()
        if self.server:
            metrics.TOOL_CALL_SECONDS.labels(self.server).observe(seconds)
        if logger.isEnabledFor(logging.DEBUG):
            with trace.use_span(self.span, end_on_exit=False) if self.span else contextlib.nullcontext():
                logger.debug("%s: %s (%s), %.1f ms", self.name, outcome, self.decision, seconds * 1000)
        if self.span is not None:
            self.span.set_attribute("undo.outcome", outcome)
            if self.error:
                self.span.set_attribute("error.type", self.error)
                if self.error.lstrip("-").isdigit():
                    self.span.set_attribute("rpc.response.status_code", self.error)
                self.span.set_status(Status(StatusCode.ERROR))
            if self._owned:
                self.span.end()

    def end_after(self, written) -> None:
        """End once `written` (the answer's journal write, an asyncio future) is done; at once without one."""
        if written is None or written.done():
            self.end()
        else:
            written.add_done_callback(lambda _: self.end())


class _Unobserved:
    """Marks that go nowhere."""

    def opened(self, opened) -> None:
        pass

    def mark(self, outcome: str, error: str = "") -> None:
        pass

    def upstream_failed(self, exc) -> None:
        pass

    def after_hold(self, refusal: tuple) -> None:
        pass


_UNOBSERVED = _Unobserved()


def still_held(refusal: tuple) -> bool:
    """Whether a held call's refusal (words, advice, and the `heldCall` it names, when it names one) tells
    the agent its call still waits for approval, rather than that it was refused."""
    extra = refusal[2] if len(refusal) > 2 and isinstance(refusal[2], dict) else {}
    held = extra.get("heldCall")
    return isinstance(held, dict) and held.get("state") == "pending"


def upstream_span(server: str, tool: str):
    """The upstream `tools/call` (a CLIENT span), the child of the agent's call: a context manager."""
    if not tracing.on():
        return contextlib.nullcontext()
    return tracing.TRACER.start_as_current_span(
        f"tools/call {tool}", kind=SpanKind.CLIENT,
        attributes={"mcp.method.name": "tools/call", "gen_ai.tool.name": tool, "gen_ai.operation.name":
                    "execute_tool", "undo.server": server})
