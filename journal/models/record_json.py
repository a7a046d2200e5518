"""The field a run's record keeps its entries' and its steps' JSON in."""

from django.db import models

from ..canonical import from_jsonb


class RecordJSONField(models.JSONField):
    """JSON as it was written, on every database: PostgreSQL's jsonb keeps a number's value, not its form, so
    the float 1e21 comes back from it as an integer JCS cannot write; it is given back as the float it was
    (`canonical.from_jsonb`), so a chain entry hashes on PostgreSQL as it did when it was appended, and a
    step's arguments, result, earlier state and compensation arguments are what the agent and the server
    sent (an undo sends the float back, and a plan that signs them can write them in JCS)."""

    def from_db_value(self, value, expression, connection):
        value = super().from_db_value(value, expression, connection)
        return from_jsonb(value) if connection.vendor == "postgresql" else value
