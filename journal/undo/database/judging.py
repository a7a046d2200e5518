"""What a reading of an agent's SQL (`reading`) means for its undo, given what the database says about its
tables (`Catalog`): reads change nothing; row changes on captured tables with a primary key can be undone
row by row; anything else cannot, and says what it would destroy; text the grammar cannot read is unknown.
No ORM and no clock."""

from collections.abc import Mapping
from dataclasses import dataclass, field

from ...record.canonical import sha256_hex
from ..declarations import Compensation, UndoDeclaration
from . import rows
from .reading import Reading, Statement, named, plural

SOURCE = "database"
# What a database undo runs, as the plan names it: the Recorder's own restore, through its own connection.
RESTORE_TOOL = "restore_rows"
REMEDY = "Restore what it changed from a backup, or by hand."


@dataclass(frozen=True)
class Catalog:
    """What the database says, read just before the call: each table's primary key (by every name the SQL
    may use for it: `contacts` and `public.contacts`), which tables are captured, and how many rows the
    tables a statement would destroy hold now."""

    keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    captured: frozenset[str] = frozenset()
    counts: Mapping[str, int] = field(default_factory=dict)
    # What writing a table reaches beyond it (PostgreSQL's catalogue: `journal.upstream.reach`): for each
    # table, (a table reached, how) — ("public.orders", "deletes", "ON DELETE CASCADE") — and (how, why) for
    # what cannot be followed ("", "", "its trigger audit runs SQL it builds as it goes").
    reaches: Mapping[str, tuple[tuple[str, str, str], ...]] = field(default_factory=dict)

    def as_record(self) -> dict:
        data = {"captured": sorted(self.captured), "counts": dict(sorted(self.counts.items()))}
        if self.reaches:
            data["reaches"] = {table: [list(r) for r in reached] for table, reached in self.reaches.items()}
        return data


def rows_of(tables: tuple[str, ...], counts: Mapping[str, int]) -> str:
    """"1,196 rows" for one table; "customers: 1,196 rows; orders: 40 rows" for several."""
    known = [t for t in dict.fromkeys(tables) if t in counts]
    if len(known) == 1 and len(set(tables)) == 1:
        return plural(counts[known[0]], "row")
    return "; ".join(f"{t}: {plural(counts[t], 'row')}" for t in known)


def uncapturable(statement: Statement, catalog: Catalog) -> str | None:
    """Why a row change cannot be undone row by row, or None when every table it changes can be."""
    counted = rows_of(statement.destroys, catalog.counts)
    verb = f"{statement.verb} ({counted})" if counted else statement.verb
    for table in (*statement.writes, *statement.triggers):
        by_trigger = table in statement.triggers and table not in statement.writes
        through = " (through a trigger)" if by_trigger else ""
        if table not in catalog.captured:
            return (f"it {verb}, and {table}{through} is not captured (an admin captures a table before "
                    "agents change it)")
        if not catalog.keys.get(table):
            return f"it {verb}, and {table}{through} has no primary key, so its rows cannot be told apart"
    return unreached(statement, catalog)


def unreached(statement: Statement, catalog: Catalog) -> str | None:
    """Why what a row change reaches beyond its own tables (foreign keys' actions, user triggers, rules)
    cannot be undone row by row: "deleting companies also deletes orders (ON DELETE CASCADE), which the
    capture does not keep"; None when all of it can."""
    doing = {"inserts": "inserting into", "updates": "updating", "deletes": "deleting",
             "merges": "merging into"}
    for table in statement.writes:
        action = doing.get(statement.verb.split(" ", 1)[0], "changing")
        for reached, verb, how in catalog.reaches.get(table, ()):
            if not reached:
                return f"{action} {table} reaches further than the Recorder can follow: {how}"
            if reached not in catalog.captured:
                return (f"{action} {table} also {verb} {reached} ({how}), which the capture does not keep "
                        "(an admin captures a table before agents change it)")
            if not catalog.keys.get(reached):
                return (f"{action} {table} also {verb} {reached} ({how}), which has no primary key, so its "
                        "rows cannot be told apart")
    return None


def destroyed(statement: Statement, catalog: Catalog) -> str:
    """A destroying statement's reason, with the rows it would take (a count read before the call)."""
    counted = rows_of(statement.destroys, catalog.counts)
    if counted:
        return f"It {statement.verb}: {counted}."
    return f"{statement.reason[:1].upper()}{statement.reason[1:]}."


def declare(reading: Reading, catalog: Catalog) -> UndoDeclaration:
    """The call's undo declaration, from its worst statement."""
    kind, worst = reading.kind, reading.worst
    if kind == "unknown":
        return UndoDeclaration(kind="unknown", source=SOURCE, problems=(reading.problem or "no statement",))
    if kind == "read":
        return UndoDeclaration(kind="read_only", source=SOURCE)
    if kind == "rows":
        blocked = [why for s in reading.statements if s.kind == "rows" and (why := uncapturable(s, catalog))]
        if blocked:
            why = blocked[0]
            return UndoDeclaration(kind="none", source=SOURCE, reason=f"{why[:1].upper()}{why[1:]}.",
                                   remedy=REMEDY)
        return UndoDeclaration(kind="compensate", source=SOURCE, compensation=Compensation(
            tool=RESTORE_TOOL, dialect="database", versioned=True))
    if kind == "refused":
        return UndoDeclaration(kind="none", source=SOURCE, reason=f"Refused: {worst.reason}.",
                               remedy="Nothing was sent; nothing needs undoing.")
    return UndoDeclaration(kind="none", source=SOURCE, reason=destroyed(worst, catalog), remedy=REMEDY)


def to_count(reading: Reading) -> tuple[str, ...]:
    """The tables whose rows a person should hear the count of before the call: those it drops, empties,
    or deletes every row of."""
    return tuple(dict.fromkeys(t for s in reading.statements if s.kind in ("destroy", "rows")
                               for t in s.destroys))


def summary(reading: Reading) -> str:
    """The text's statements in one line: "updates rows of contacts; deletes rows of contacts"."""
    verbs = list(dict.fromkeys(s.verb for s in reading.statements))
    return named(verbs[:5]) + (f" and {len(verbs) - 5} more" if len(verbs) > 5 else "")


def from_state(state: Mapping) -> UndoDeclaration:
    """The declaration the Recorder worked out just before the call (`state["database"]["undo"]`), as the
    step keeps it; unknown, saying why, when it could not read the statements or their database."""
    found = state.get("database") if isinstance(state, Mapping) else None
    undo = found.get("undo") if isinstance(found, Mapping) else None
    if not isinstance(undo, Mapping):
        problem = (found or {}).get("problem") if isinstance(found, Mapping) else None
        return UndoDeclaration(kind="unknown", source=SOURCE, problems=(
            problem or "its statements were not read before the call",))
    declaration = UndoDeclaration.model_validate(undo)
    if declaration.compensation is not None and declaration.compensation.dialect == "database":
        # Checked row by row against what the capture kept: as versioned as any undo gets.
        return declaration.model_copy(update={
            "compensation": declaration.compensation.model_copy(update={"versioned": True})})
    return declaration


def after_call(found: Mapping, *, kind: str, kept: list[Mapping] | None = None) -> dict:
    """The step's undo once the rows the call changed are known (`found`: what the capture kept of them,
    `journal.upstream.windows`), as the step's column values over those its declaration gave it (`kind`);
    `kept`: the tables the Recorder kept before an approved destruction (`journal.upstream.snapshots`)."""
    if found.get("problem"):
        return {"reversibility": "unknown", "undo_problems": [found["problem"]],
                "compensation_arguments": None,
                "effect_summary": "What it changed in the database is not known exactly."}
    if kept:
        return destroyed_but_kept(kept)
    words = rows.changed_words(found.get("tables") or {})
    if found.get("misread"):  # the statements read as a read, and the capture kept rows: the rows decide
        kind = "compensate"
        words = f"{words}, though its statements read as a read"
    if not found.get("count"):
        if kind not in ("compensate", "read_only"):  # a destruction changes no row a trigger sees
            return {}
        return {"reversibility": "read_only", "undo_problems": [], "compensation_arguments": None,
                "effect_summary": "It changed no rows.", "effect_version": ""}
    summary = {"effect_summary": f"{words[0].upper()}{words[1:]}.",
               "effect_resource": ", ".join(found["tables"])}
    if kind != "compensate":
        return summary
    arguments = {"rows": found["count"], "sha256": found["sha256"], "tables": found["tables"],
                 "from": found["from"], "to": found["to"]}
    if found.get("inCapture"):  # over the bound the record keeps: the undo reads them from the capture
        arguments["inCapture"] = True
    undo = {**summary, "reversibility": "compensate", "undo_problems": [], "effect_version": found["sha256"],
            "compensation_arguments": arguments}
    if found.get("misread"):  # its declaration was a read's, made before the call: the rows say otherwise
        undo["declaration"] = restoring()
    return undo


def restoring() -> dict:
    """The declaration of a call whose rows the Recorder puts back itself, as the step keeps it."""
    return UndoDeclaration(kind="compensate", source=SOURCE, compensation=Compensation(
        tool=RESTORE_TOOL, dialect="database", versioned=True)).model_dump(mode="json")


def kept_words(kept: Mapping) -> str:
    """"dropped table contacts (1,196 rows)" or "emptied contacts (1,196 rows)"."""
    verb = "dropped table" if kept["how"] == "drop" else "emptied"
    return f"{verb} {kept['table']} ({plural(kept['rows'], 'row')})"


def destroyed_but_kept(kept: list[Mapping]) -> dict:
    """A destruction a person approved, whose tables the Recorder kept first: undoable, by re-creating and
    reloading them."""
    said = "; ".join(kept_words(k) for k in kept)
    summary = [{"table": k["table"], "how": k["how"], "rows": k["rows"], "copy": k["copy"]} for k in kept]
    return {"reversibility": "compensate", "undo_problems": [],
            "effect_summary": f"{said[:1].upper()}{said[1:]}: kept beforehand, so it can be undone.",
            "effect_resource": ", ".join(k["table"] for k in kept),
            "effect_version": sha256_hex(summary), "compensation_arguments": {"kept": summary},
            "declaration": restoring()}


def database_rows(after_state) -> Mapping | None:
    """What the capture kept of a call's rows (its outcome's `after_state`), or None for another call."""
    found = after_state.get("database") if isinstance(after_state, Mapping) else None
    return found if isinstance(found, Mapping) else None
