"""The Recorder as one ASGI app, built from the settings: what `approver.asgi` mounts at /mcp/."""

from django.conf import settings

from . import bus
from .auth import BearerAgent, transport_security
from .fast_calls import FastCalls
from .gateway import Recorder


class RecorderApp:
    """The Recorder as one ASGI app: the agent is authenticated first (`auth.BearerAgent`), then a plain
    2026-07-28 call takes `fast_calls` and everything else the SDK's app. `recorder` and `fast_calls` are
    here for tests and benchmarks that tune or count them."""

    def __init__(self, recorder: Recorder, *, security, fast: bool):
        self.recorder = recorder
        self.fast_calls = FastCalls(
            forward=recorder.forward, not_delivered=recorder.outcomes.not_delivered, sdk_app=recorder.sdk_app,
            server_info=recorder.server.server_info_stamp, security=security) if fast else None
        self._app = BearerAgent(recorder.sdk_app, self.fast_calls, on_session_end=recorder.session_ended)

    async def __call__(self, scope, receive, send):
        await self._app(scope, receive, send)


def build_app() -> RecorderApp:
    security = transport_security()
    recorder = Recorder(
        timeout=settings.TOOL_SERVER_TIMEOUT,
        idle_seconds=settings.RECORDER_UPSTREAM_IDLE_SECONDS,
        max_sessions=settings.RECORDER_MAX_UPSTREAM_SESSIONS,
        max_answer_bytes=settings.RECORDER_MAX_RESULT_BYTES,
        bus_url=settings.RECORDER_BUS_URL,
        bus_key=bus.bus_key(settings.SECRET_KEY),
        security=security,
        session_idle_seconds=settings.RECORDER_SESSION_IDLE_SECONDS,
    )
    return RecorderApp(recorder, security=security, fast=settings.RECORDER_FAST_CALLS)
