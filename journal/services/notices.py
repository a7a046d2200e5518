"""Notices: what the audit stream says that is no run's (`models.Notice`). Written one at a time, so ids
commit in order and the stream, which sends them by id, never passes one still to commit."""

from datetime import datetime
from typing import Any

from django.db import connection, transaction

from ..models import Notice, ToolServer


def notify(*, event: str, server: ToolServer | None, data: dict[str, Any], now: datetime) -> Notice:
    """A notice for the audit stream, in the caller's transaction if it has one (it commits with what it
    says). On PostgreSQL the table is locked against other writers until the commit: a notice's id is taken
    only once every earlier one has committed."""
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(f"LOCK TABLE {Notice._meta.db_table} IN SHARE ROW EXCLUSIVE MODE")
        return Notice.objects.create(at=now, event=event, server=server,
                                     server_name=server.name if server else "", data=data)
