"""Where a database server's database is, as an admin registers it: a PostgreSQL URL
(`postgresql://user:password@host:5432/name`) or an SQLite file's path (`/srv/crm.db`, `sqlite:///srv/crm.db`).
Which grammar reads its SQL follows from it. No ORM and no clock."""

import re
from urllib.parse import urlsplit, urlunsplit

POSTGRESQL = "postgresql"
SQLITE = "sqlite"


class NotADatabase(ValueError):
    """The text names no database the Recorder can reach."""


def dialect_of(place: str) -> str:
    """"postgresql" or "sqlite"; NotADatabase says why it is neither."""
    scheme = urlsplit(place).scheme.lower()
    if scheme in ("postgresql", "postgres"):
        return POSTGRESQL
    if scheme in ("sqlite", "") and place.strip():
        return SQLITE
    raise NotADatabase(f"{shown_database(place)!r} is neither a PostgreSQL URL (postgresql://…) nor an "
                       "SQLite file's path.")


def sqlite_path(place: str) -> str:
    """The file of an SQLite place (`sqlite:///srv/crm.db` or the bare path)."""
    return urlsplit(place).path if place.lower().startswith("sqlite:") else place


def postgresql_url(place: str) -> str:
    """The URL psycopg connects with (it takes `postgresql://`, not `postgres://`)."""
    return "postgresql://" + place.split("://", 1)[1]


def shown_database(place: str) -> str:
    """The place as pages and logs show it: the password replaced by ***."""
    parts = urlsplit(place)
    if not parts.password:
        return place
    user = parts.username or ""
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit((parts.scheme, f"{user}:***@{host}{port}", parts.path, parts.query, parts.fragment))


_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^\s:/@]*:)([^\s@/]+)(@)", re.IGNORECASE)


def without_passwords(text: str) -> str:
    """Every URL's password in `text` (a command line with a DSN in it) replaced by ***."""
    return _URL_PASSWORD.sub(r"\1***\3", text)
