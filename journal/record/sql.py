"""Hand-built statements for the Recorder's hot path.

Every tool call is journaled in two short transactions (the intent, then the outcome), and building their
handful of statements with the ORM's query compiler cost more than running them. These helpers build each
statement once per model and database vendor from the model's own metadata (table, columns, and each field's
conversion for the database in use), so a column list cannot drift from the model. Values go through the
same `get_db_prep_save` the ORM uses (plain values skip its layers, to the same result). Everything that is
not on the hot path uses the ORM.

The caller holds the transaction (and, for a run, its row lock); these helpers only run statements.
"""

import contextlib
import threading
from datetime import UTC, datetime
from functools import cache, lru_cache
from typing import Any

import orjson
import psycopg
from django.db import connection, connections
from django.db.models import Field, Model

from .canonical import storable_text


class _PreparedCursor(psycopg.Cursor):
    """A PostgreSQL cursor that binds its parameters on the server and prepares each statement once per
    connection. Django's own cursors write every value into the statement's text (client-side binding), which
    the server then parses and plans again each time; the hot path's handful of statements are the same on
    every call, so each is planned once and then only executed."""

    def execute(self, query, params=None, *, prepare=None, binary=None):
        return super().execute(query, params, prepare=True, binary=binary)


def _cursor(database):
    """A cursor for these statements: Django's, wrapped as every cursor is (query logging, execute wrappers,
    database errors as Django's), on PostgreSQL over a `_PreparedCursor`."""
    if database.vendor != "postgresql":
        return database.cursor()
    database.close_if_health_check_failed()
    database.ensure_connection()
    database.validate_thread_sharing()
    with database.wrap_database_errors:
        cursor = _PreparedCursor(database.connection)
    return database.make_debug_cursor(cursor) if database.queries_logged else database.make_cursor(cursor)


@contextlib.contextmanager
def pipelined():
    """Inside it, on PostgreSQL, the statements of this module whose results are not read (an entry appended,
    a run's moving columns written back) go to the server with the next statement whose result is read,
    instead of each waiting for a round trip of its own (psycopg's pipeline mode). A statement's error then
    surfaces at a later one, so the caller treats any failure inside as the whole block's: the journal thread
    rolls its group back and runs each job alone. Statements through Django's own cursors (the ORM's) are
    each waited for, so a row count the ORM reads is the real one. On SQLite, nothing changes."""
    database = connections[connection.alias]
    if database.vendor != "postgresql":
        yield
        return
    database.ensure_connection()
    with database.connection.pipeline() as pipeline:

        def waited(execute, sql, params, many, context):
            result = execute(sql, params, many, context)
            if not isinstance(context["cursor"].cursor, _PreparedCursor):
                pipeline.sync()
            return result

        with database.execute_wrapper(waited):
            yield


_moment = threading.local()


@contextlib.contextmanager
def one_moment():
    """Inside it, on this thread, reads made through `remembered` are made once. The journal thread runs a
    group of jobs in one transaction, in a few milliseconds, as if at one moment: a server's catalogue stamp
    or the policy log's head read by its first job holds for the others (a change committed meanwhile
    applies from the next group, as it would have if it had come a moment later), and a run row the
    transaction has locked cannot change under it until the commit, which ends the moment."""
    _moment.reads = {}
    try:
        yield
    finally:
        _moment.reads = None


def remembered(key, read):
    """`read()`, made once per `one_moment` under `key` (what it gave, None too, holds for the moment)."""
    reads = getattr(_moment, "reads", None)
    if reads is None:
        return read()
    if key not in reads:
        reads[key] = read()
    return reads[key]


def recalled(key):
    """What is kept under `key` in this moment, or None (also outside one)."""
    reads = getattr(_moment, "reads", None)
    return reads.get(key) if reads is not None else None


def remember(key, value) -> None:
    """Keep `value` under `key` for the rest of the moment, if there is one."""
    reads = getattr(_moment, "reads", None)
    if reads is not None:
        reads[key] = value


@cache
def _insert_sql(model: type[Model], vendor: str) -> tuple[tuple[Field, ...], str]:
    fields = tuple(f for f in model._meta.concrete_fields if not f.primary_key)
    quote = connection.ops.quote_name
    columns = ", ".join(quote(f.column) for f in fields)
    marks = ", ".join(["%s"] * len(fields))
    pk = quote(model._meta.pk.column)
    return fields, f"INSERT INTO {quote(model._meta.db_table)} ({columns}) VALUES ({marks}) RETURNING {pk}"


def insert(model: type[Model], values: dict[str, Any], *, returning: bool = True) -> int | None:
    """Insert one row and return its primary key (or, with `returning=False`, nothing: inside `pipelined`
    the statement then need not wait for its answer). Fields not given take their model default."""
    database = connections[connection.alias]  # the wrapper itself, not the proxy, for every value
    plan = _insert_plan(model, database.vendor)
    with _cursor(database) as cursor:
        cursor.execute(plan.sql if returning else plan.plain_sql, plan.row(values, database))
        return cursor.fetchone()[0] if returning else None


# Column types whose value, of exactly this Python type, the database drivers take as it is.
_AS_IT_IS = {"CharField": str, "TextField": str, "BooleanField": bool, "FloatField": float,
             "IntegerField": int, "BigIntegerField": int, "PositiveIntegerField": int,
             "PositiveBigIntegerField": int, "PositiveSmallIntegerField": int, "SmallIntegerField": int,
             "ForeignKey": int}


class JsonText(str):
    """A JSON column's value already written as JSON text (the JCS bytes a chain entry was hashed from), for
    `insert`, `insert_many` and `update` to pass as it is instead of writing it again: SQLite keeps JSON as
    text, and PostgreSQL reads a text parameter of unknown type as the column's jsonb."""


def _prepared(value: Any, field: Field, kind: type | str | None, database, parsed: bool = False) -> Any:
    """`value` as the database takes it for `field`: as the ORM prepares it (`get_db_prep_save`), except
    that a value the driver takes as it is, an aware datetime and JSON already written skip the ORM's
    layers (the same result, for a fraction of the work on a path every call takes). With `parsed` (the
    value was read by a strict JSON parser, so it holds no NaN or Infinity), a JSON column's object or array
    is written by orjson."""
    vtype = type(value)
    if kind is str and vtype is str:  # a text from outside (a server's error) as the record keeps it
        return storable_text(value)
    if vtype is kind or value is None:  # every field of these models writes None as SQL NULL
        return value
    if kind == "DateTimeField" and vtype is datetime and value.tzinfo is not None:
        if value.tzinfo is UTC and database.vendor == "sqlite" and database.timezone is UTC:
            return value.replace(tzinfo=None).isoformat(" ")  # Django's own text for it, without its layers
        return database.ops.adapt_datetimefield_value(value)
    if vtype is JsonText:
        return str(value)
    if parsed and kind == "JSONField" and (vtype is dict or vtype is list):
        try:
            return orjson.dumps(value).decode()
        except TypeError:  # an integer beyond 64 bits, which orjson does not write: the ORM's way
            pass
    return field.get_db_prep_save(value, database)


class _InsertPlan:
    """A model's insert statement and its row template: each column's default prepared once (a default that
    is a new value each time, a timestamp or a UUID, is made per row), so a row costs the preparing of the
    values it gives and nothing for the columns it leaves to their default."""

    def __init__(self, model: type[Model], database) -> None:
        fields, self.sql = _insert_sql(model, database.vendor)
        self.plain_sql = self.sql[:self.sql.rindex(" RETURNING ")]
        quote = connection.ops.quote_name
        self.copy_sql = (f"COPY {quote(model._meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "
                         "FROM STDIN")
        kinds = _kinds(model)
        self.model, self.template, self.each_time, self.columns = model, [], [], {}
        for index, field in enumerate(fields):
            constant = not field.has_default() or not callable(field.default) or field.default in (dict, list)
            self.template.append(field.get_db_prep_save(field.get_default(), database) if constant else None)
            if not constant:
                self.each_time.append((index, field))
            self.columns[field.attname] = (index, field, kinds[field.attname][1])

    def row(self, values: dict[str, Any], database, parsed: bool = False) -> list[Any]:
        """One row's parameters: each column's value, or its default (`parsed`: see `_prepared`)."""
        params = self.template.copy()
        for index, field in self.each_time:
            params[index] = field.get_db_prep_save(field.get_default(), database)
        columns = self.columns
        try:
            for name, value in values.items():
                index, field, kind = columns[name]
                vtype = type(value)
                if vtype is kind and (vtype is not str or value.isascii() and "\x00" not in value):
                    params[index] = value  # `_prepared`'s commonest case, without a call a value
                else:
                    params[index] = _prepared(value, field, kind, database, parsed)
        except KeyError:
            unknown = sorted(values.keys() - columns.keys())
            raise TypeError(f"{self.model.__name__} has no field(s) {unknown}") from None
        return params


@cache
def _insert_plan(model: type[Model], vendor: str) -> _InsertPlan:
    return _InsertPlan(model, connections[connection.alias])


def insert_many(
    model: type[Model], rows: list[dict[str, Any]], *, chunk: int = 5000, parsed: bool = False
) -> None:
    """Insert many rows at compiled speed: on PostgreSQL with `COPY … FROM STDIN` (psycopg's copy, which
    streams the rows in the protocol's own format), on SQLite with one prepared statement run over `chunk`
    rows at a time; no model instance per row, no query compiled per batch. Fields a row does not give take
    their model default; `parsed` rows were read by a strict JSON parser (see `_prepared`). Returns nothing:
    for records that are read back by their own keys (an imported run's entries and steps)."""
    database = connections[connection.alias]
    plan = _insert_plan(model, database.vendor)
    with _cursor(database) as cursor:
        if database.vendor == "postgresql":
            with database.wrap_database_errors, cursor.cursor.copy(plan.copy_sql) as copy:
                for row in rows:
                    copy.write_row(plan.row(row, database, parsed))
            return
        for start in range(0, len(rows), chunk):
            cursor.executemany(plan.plain_sql,
                               [plan.row(row, database, parsed) for row in rows[start:start + chunk]])


@cache
def _fields(model: type[Model]) -> dict[str, Field]:
    return {f.attname: f for f in model._meta.concrete_fields}


@cache
def _update_sql(
    model: type[Model], vendor: str, names: tuple[str, ...], guards: tuple[str, ...]
) -> tuple[str, bool]:
    """The statement, and whether it reads back the rows it changed (their count is then its result)."""
    quote = connection.ops.quote_name
    fields = _fields(model)
    assignments = ", ".join(f"{quote(fields[name].column)} = %s" for name in names)
    conditions = " AND ".join(f"{quote(fields[name].column)} = %s" for name in ("id", *guards))
    # On PostgreSQL a conditional update names the rows it changed, so its count is read as a result, which
    # `pipelined` waits for (a row count alone would not be known yet).
    reads_back = bool(guards) and vendor == "postgresql"
    returning = f" RETURNING {quote(model._meta.pk.column)}" if reads_back else ""
    return f"UPDATE {quote(model._meta.db_table)} SET {assignments} WHERE {conditions}{returning}", reads_back


def update(
    model: type[Model], pk: int, values: dict[str, Any], *, only_if: dict[str, Any] | None = None
) -> int:
    """Set `values` on the row `pk` (and only if its columns still equal `only_if`); the number of rows
    changed (inside `pipelined`, only a conditional update knows it: an unconditional one says -1).

    The conditional form is how a claim or a close stays exactly-once: check the count."""
    only_if = only_if or {}
    database = connections[connection.alias]
    kinds = _kinds(model)
    names, guards = tuple(values), tuple(only_if)
    sql, reads_back = _update_sql(model, database.vendor, names, guards)
    params = [_prepared(value, *kinds[name], database) for name, value in values.items()]
    params += [pk, *(_prepared(value, *kinds[name], database) for name, value in only_if.items())]
    with _cursor(database) as cursor:
        cursor.execute(sql, params)
        return len(cursor.fetchall()) if reads_back else cursor.rowcount


@cache
def _kinds(model: type[Model]) -> dict[str, tuple[Field, type | str | None]]:
    """Each field by attname, with its kind for `_prepared`."""
    kinds = {}
    for name, field in _fields(model).items():
        internal = field.get_internal_type()
        kinds[name] = (field, _AS_IT_IS.get(internal, internal if internal in _BY_NAME else None))
    return kinds


# Column types `_prepared` knows by name.
_BY_NAME = ("DateTimeField", "JSONField")


@cache
def _select_sql(model: type[Model], vendor: str, names: tuple[str, ...], where: str, lock: bool) -> str:
    quote = connection.ops.quote_name
    fields = _fields(model)
    columns = ", ".join(quote(fields[name].column) for name in names)
    lock_clause = " FOR UPDATE" if lock and connection.features.has_select_for_update else ""
    return f"SELECT {columns} FROM {quote(model._meta.db_table)} WHERE {where}{lock_clause}"


def first_row(model: type[Model], names: tuple[str, ...], where: str, params: list[Any], *,
              lock: bool = False) -> tuple | None:
    """The raw database values of `names` in the first row matching `where` (SQL over column names with %s
    placeholders), row-locked if asked and the database has row locks (SQLite's `BEGIN IMMEDIATE` already
    holds the whole database)."""
    database = connections[connection.alias]
    sql = _select_sql(model, database.vendor, names, where, lock)
    with _cursor(database) as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()


def locked_row(model: type[Model], names: tuple[str, ...], where: str, params: list[Any]) -> Model | None:
    """The first row matching `where`, locked, as a model instance with only `names` loaded (others load on
    first access). `names` must be fields whose raw database values need no conversion (integers, text)."""
    names = _in_model_order(model, names)  # `from_db` reads a partial row in the model's field order
    row = first_row(model, names, where, params, lock=True)
    return model.from_db(connection.alias, list(names), row) if row is not None else None


@cache
def _in_model_order(model: type[Model], names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(name for name in _fields(model) if name in names)


def prep(model: type[Model], name: str, value: Any) -> Any:
    """A value as the database takes it for `model.name` (for the parameters of a `where`)."""
    return _fields(model)[name].get_db_prep_save(value, connection)


def all_rows(model: type[Model], names: tuple[str, ...], where: str, params: list[Any]) -> list[tuple]:
    """The raw database values of `names` in every row matching `where` (see `first_row`)."""
    database = connections[connection.alias]
    with _cursor(database) as cursor:
        cursor.execute(_select_sql(model, database.vendor, names, where, False), params)
        return cursor.fetchall()


def marks(count: int) -> str:
    """Placeholders for an `IN (...)` of `count` values."""
    return ", ".join(["%s"] * count)


@lru_cache(maxsize=256)  # one statement per model and number of rows
def _upsert_sql(model: type[Model], vendor: str, names: tuple[str, ...], unique: tuple[str, ...],
                replace: tuple[str, ...], increment: str, rows: int) -> str:
    quote = connection.ops.quote_name
    fields = _fields(model)
    table = quote(model._meta.db_table)
    row = f"({marks(len(names))})"
    sets = [f"{quote(fields[name].column)} = excluded.{quote(fields[name].column)}" for name in replace]
    if increment:
        column = quote(fields[increment].column)
        sets.append(f"{column} = {table}.{column} + 1")
    return (
        f"INSERT INTO {table} ({', '.join(quote(fields[name].column) for name in names)}) "
        f"VALUES {', '.join([row] * rows)} "
        f"ON CONFLICT ({', '.join(quote(fields[name].column) for name in unique)}) "
        f"DO UPDATE SET {', '.join(sets)}"
    )


def upsert(
    model: type[Model],
    rows: list[dict[str, Any]],
    *,
    unique: tuple[str, ...],
    replace: tuple[str, ...],
    increment: str = "",
) -> None:
    """Insert `rows` (dicts with the same keys) in one statement; where a row with the same `unique` fields
    exists already, set its `replace` fields from the new row and add 1 to its `increment` field instead
    (`ON CONFLICT … DO UPDATE`, on SQLite and PostgreSQL alike)."""
    if not rows:
        return
    names = tuple(rows[0])
    database = connections[connection.alias]
    kinds = _kinds(model)
    params = [_prepared(row[name], *kinds[name], database) for row in rows for name in names]
    with _cursor(database) as cursor:
        cursor.execute(
            _upsert_sql(model, database.vendor, names, unique, replace, increment, len(rows)), params
        )


def one_row(statement: str, params: list[Any]) -> tuple | None:
    """The first row of `statement`, a statement of its own (one of `journal.services.one_statement`'s)."""
    database = connections[connection.alias]
    with _cursor(database) as cursor:
        cursor.execute(statement, params)
        return cursor.fetchone()


def json_row(model: type[Model], values: dict[str, Any]) -> str:
    """A new row of `values` (those not given, their model default) as one JSON object of its columns, for
    `jsonb_populate_record` on PostgreSQL: texts as the record keeps them, datetimes in RFC 3339."""
    row = {}
    for field in model._meta.concrete_fields:
        if field.primary_key:
            continue
        value = values[field.attname] if field.attname in values else field.get_default()
        row[field.column] = storable_text(value) if type(value) is str else value
    return orjson.dumps(row).decode()


def prepared_values(model: type[Model], values: dict[str, Any]) -> list[Any]:
    """The parameters of `values`, in their order, prepared as `update` prepares them."""
    database = connections[connection.alias]
    kinds = _kinds(model)
    return [_prepared(value, *kinds[name], database) for name, value in values.items()]
