"""The field a run's record keeps its entries' and its steps' JSON in."""

import json

from django.db import models
from django.db.models.fields.json import KeyTransform

from ..record.canonical import from_jsonb, loads_record


class RecordJSONField(models.JSONField):
    """JSON as it was written, on every database: PostgreSQL's jsonb keeps a number's value, not its form,
    and a chain entry's data is stored as its JCS text (which writes the float 1e20 as
    100000000000000000000), so a float beyond 2**53 comes back as an integer JCS cannot write; it is given
    back as the float it was (`canonical.from_jsonb`), so a chain entry hashes as it did when it was
    appended, and a step's arguments, result, earlier state and compensation arguments are what the agent
    and the server sent (an undo sends the float back, and a plan that signs them can write them in JCS)."""

    def from_db_value(self, value, expression, connection):
        if isinstance(value, str) and self.decoder is None and not isinstance(expression, KeyTransform):
            # The text as the database gave it (both SQLite and Django's psycopg give JSON as text): read
            # with the integers restored in the parse, as `JSONField` would read it otherwise.
            try:
                return loads_record(value)
            except json.JSONDecodeError:
                return value
        return from_jsonb(super().from_db_value(value, expression, connection))
