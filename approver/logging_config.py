"""Django's LOGGING for the settings: one handler that strikes secrets out of every line and adds what the
line belongs to (`journal.telemetry.logs`), writing text or JSON; Django's and uvicorn's own lines go
through it too. Named by dotted paths: the settings import no app module."""


def logging_config(*, level: str, form: str) -> dict:
    """The LOGGING dict for LOG_LEVEL `level` and LOG_FORMAT `form` (text or json)."""
    formatter = {"()": "journal.telemetry.logs.Json"} if form == "json" else {
        "format": "%(levelname)s %(name)s: %(message)s"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"context": {"()": "journal.telemetry.logs.Context"},
                    "redact": {"()": "journal.telemetry.logs.Redact"}},
        "formatters": {"line": formatter},
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "line",
                                 "filters": ["redact", "context"]}},
        "root": {"handlers": ["console"], "level": level},
        "loggers": {
            "httpx": {"level": "WARNING"},
            "httpx2": {"level": "WARNING"},
            "mcp": {"level": "WARNING"},
            # The filesystem broker has no host; kombu warns about it on every connection.
            "kombu.connection": {"level": "ERROR"},
            **{name: {"handlers": ["console"], "propagate": False}
               for name in ("django", "uvicorn.error", "uvicorn.access")},
        },
    }
