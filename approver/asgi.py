"""One ASGI application: the Recorder's MCP endpoint at /mcp/, Django for everything else.

Run it with uvicorn. The lifespan protocol goes to the Recorder (Django has none): it opens the upstream
sessions and the MCP session manager, and closes them on shutdown.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "approver.settings")
django_app = get_asgi_application()

from journal.mcp.app import build_app  # noqa: E402 - needs Django set up first


class Application:
    """The Recorder at /mcp/ (and the lifespan), Django for everything else. `recorder` and `fast_calls` are
    the Recorder's, for tests and benchmarks that tune the upstream timeout or count fast calls."""

    def __init__(self):
        self.recorder_app = build_app()  # its MCP session manager can be started once only

    @property
    def recorder(self):
        return self.recorder_app.recorder

    @property
    def fast_calls(self):
        return self.recorder_app.fast_calls

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            return await self.recorder_app(scope, receive, send)
        path = scope.get("path", "")
        if scope["type"] == "http" and (path == "/mcp" or path.startswith("/mcp/")):
            if path == "/mcp":
                scope = {**scope, "path": "/mcp/", "raw_path": b"/mcp/"}
            return await self.recorder_app(scope, receive, send)
        return await django_app(scope, receive, send)


def build_application() -> Application:
    """A fresh application; the MCP session manager inside it can be started once only."""
    return Application()


application = build_application()
