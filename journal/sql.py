"""Hand-built statements for the Recorder's hot path.

Every tool call is journaled in two short transactions (the intent, then the outcome), and building their
handful of statements with the ORM's query compiler cost more than running them. These helpers build each
statement once per model and database vendor from the model's own metadata (table, columns, and each field's
conversion for the database in use), so a column list cannot drift from the model. Values go through the
same `get_db_prep_save` the ORM uses (plain values skip its layers, to the same result). Everything that is
not on the hot path uses the ORM.

The caller holds the transaction (and, for a run, its row lock); these helpers only run statements.
"""

from datetime import datetime
from functools import cache, lru_cache
from typing import Any

from django.db import connection, connections
from django.db.models import Field, Model


@cache
def _insert_sql(model: type[Model], vendor: str) -> tuple[tuple[Field, ...], str]:
    fields = tuple(f for f in model._meta.concrete_fields if not f.primary_key)
    quote = connection.ops.quote_name
    columns = ", ".join(quote(f.column) for f in fields)
    marks = ", ".join(["%s"] * len(fields))
    pk = quote(model._meta.pk.column)
    return fields, f"INSERT INTO {quote(model._meta.db_table)} ({columns}) VALUES ({marks}) RETURNING {pk}"


def insert(model: type[Model], values: dict[str, Any]) -> int:
    """Insert one row and return its primary key. Fields not given take their model default."""
    database = connections[connection.alias]  # the wrapper itself, not the proxy, for every value
    columns, sql = _insert_plan(model, database.vendor)
    with database.cursor() as cursor:
        cursor.execute(sql, _row(model, columns, values, database))
        return cursor.fetchone()[0]


def _row(model: type[Model], columns: tuple, values: dict[str, Any], database) -> list[Any]:
    """One row's parameters for `_insert_plan`'s statement: each column's value, or its default."""
    if unknown := values.keys() - _names(model):
        raise TypeError(f"{model.__name__} has no field(s) {sorted(unknown)}")
    params = []
    for name, field, kind, default in columns:
        if name in values:
            params.append(_prepared(values[name], field, kind, database))
        elif default is _EACH_TIME:
            params.append(field.get_db_prep_save(field.get_default(), database))
        else:
            params.append(default)
    return params


# Column types whose value, of exactly this Python type, the database drivers take as it is.
_AS_IT_IS = {"CharField": str, "TextField": str, "BooleanField": bool, "FloatField": float,
             "IntegerField": int, "BigIntegerField": int, "PositiveIntegerField": int,
             "PositiveBigIntegerField": int, "PositiveSmallIntegerField": int, "SmallIntegerField": int,
             "ForeignKey": int}
_EACH_TIME = object()  # a default that is a new value each time (a timestamp, a UUID)


class JsonText(str):
    """A JSON column's value already written as JSON text (the JCS bytes a chain entry was hashed from), for
    `insert`, `insert_many` and `update` to pass as it is instead of writing it again: SQLite keeps JSON as
    text, and PostgreSQL reads a text parameter of unknown type as the column's jsonb."""


def _prepared(value: Any, field: Field, kind: type | str | None, database) -> Any:
    """`value` as the database takes it for `field`: as the ORM prepares it (`get_db_prep_save`), except
    that a value the driver takes as it is, an aware datetime and JSON already written skip the ORM's
    layers (the same result, for a fraction of the work on a path every call takes)."""
    vtype = type(value)
    if vtype is kind or value is None:  # every field of these models writes None as SQL NULL
        return value
    if kind == "DateTimeField" and vtype is datetime and value.tzinfo is not None:
        return database.ops.adapt_datetimefield_value(value)
    if vtype is JsonText:
        return str(value)
    return field.get_db_prep_save(value, database)


@cache
def _names(model: type[Model]) -> frozenset[str]:
    return frozenset(f.attname for f in model._meta.concrete_fields)


@cache
def _insert_plan(model: type[Model], vendor: str) -> tuple[tuple, str]:
    """Each column's (attname, field, kind for `_prepared`, default prepared once or `_EACH_TIME`), and the
    statement."""
    fields, sql = _insert_sql(model, vendor)
    database = connections[connection.alias]
    kinds = _kinds(model)
    columns = []
    for field in fields:
        kind = kinds[field.attname][1]
        constant = not field.has_default() or not callable(field.default) or field.default in (dict, list)
        default = field.get_db_prep_save(field.get_default(), database) if constant else _EACH_TIME
        columns.append((field.attname, field, kind, default))
    return tuple(columns), sql


def insert_many(model: type[Model], rows: list[dict[str, Any]], *, chunk: int = 500) -> None:
    """Insert many rows with one prepared statement (no model instance per row, no query compiled per
    batch). Fields a row does not give take their model default. Returns nothing: for records that are
    read back by their own keys (an imported run's entries and steps)."""
    database = connections[connection.alias]
    columns, returning = _insert_plan(model, database.vendor)
    sql = returning[:returning.rindex(" RETURNING ")]
    with database.cursor() as cursor:
        for start in range(0, len(rows), chunk):
            batch = rows[start:start + chunk]
            cursor.executemany(sql, [_row(model, columns, row, database) for row in batch])


@cache
def _fields(model: type[Model]) -> dict[str, Field]:
    return {f.attname: f for f in model._meta.concrete_fields}


@cache
def _update_sql(model: type[Model], vendor: str, names: tuple[str, ...], guards: tuple[str, ...]) -> str:
    quote = connection.ops.quote_name
    fields = _fields(model)
    assignments = ", ".join(f"{quote(fields[name].column)} = %s" for name in names)
    conditions = " AND ".join(f"{quote(fields[name].column)} = %s" for name in ("id", *guards))
    return f"UPDATE {quote(model._meta.db_table)} SET {assignments} WHERE {conditions}"


def update(
    model: type[Model], pk: int, values: dict[str, Any], *, only_if: dict[str, Any] | None = None
) -> int:
    """Set `values` on the row `pk` (and only if its columns still equal `only_if`); the number of rows
    changed.

    The conditional form is how a claim or a close stays exactly-once: check the count."""
    only_if = only_if or {}
    database = connections[connection.alias]
    kinds = _kinds(model)
    names, guards = tuple(values), tuple(only_if)
    sql = _update_sql(model, database.vendor, names, guards)
    params = [_prepared(value, *kinds[name], database) for name, value in values.items()]
    params += [pk, *(_prepared(value, *kinds[name], database) for name, value in only_if.items())]
    with database.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


@cache
def _kinds(model: type[Model]) -> dict[str, tuple[Field, type | str | None]]:
    """Each field by attname, with its kind for `_prepared`."""
    kinds = {}
    for name, field in _fields(model).items():
        internal = field.get_internal_type()
        kinds[name] = (field, _AS_IT_IS.get(internal, internal if internal == "DateTimeField" else None))
    return kinds


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
    sql = _select_sql(model, connection.vendor, names, where, lock)
    with connection.cursor() as cursor:
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
    with connection.cursor() as cursor:
        cursor.execute(_select_sql(model, connection.vendor, names, where, False), params)
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
    with database.cursor() as cursor:
        cursor.execute(
            _upsert_sql(model, database.vendor, names, unique, replace, increment, len(rows)), params
        )
