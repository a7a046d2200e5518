"""A call's intent and its outcome, each journaled on PostgreSQL as one statement: one round trip a
transition.

`steps.open_step` and `steps.close_step` make four or five statements each under the run's row lock (find and
lock the run, the retry guard and the halt check, the step, the chain entry, the run's head), and on
PostgreSQL each statement whose answer is read is a round trip between two processes: most of what a call
costs the journal there is waiting. Here each transition is one statement of data-modifying CTEs, which the
server runs as one: it locks the run, makes the checks, numbers the step, appends the chain entry, hashing it
from its JCS bytes and the run's head exactly as `chain.written_entry` does (`sha256` of the entry's JCS
bytes, `data` first, the members in JCS's order), and moves the run's head. Its answer says what it did.

Every check that could change the outcome is a condition of the statement, so when one does not hold the
statement writes nothing and the caller takes the usual way, which decides it as it always did: a run that
does not exist yet (it is created with its header), a run or an agent a failure halted, an earlier attempt of
the same call whose outcome is unknown (the retry guard asks the policy again, with it), an imported run; for
an outcome, links the agent declared. The links inferred from an earlier result whose values the arguments
carry are chosen in the statement by `dependencies.choose_links`'s rule (a change there is a change here),
and written into the entry as JCS writes them (PostgreSQL's `to_json` of a text is its JCS string). A
checkpoint that falls due is signed after the statement, in the same transaction (the signature needs the
Recorder's key). The durability rules are the usual ones: the statement runs in the journal group's
transaction, and its results are handed back once that commits. SQLite, where a statement costs no round
trip, takes the usual way.
"""

from datetime import datetime, timedelta
from functools import cache
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from ..models import Agent, ChainEntry, Run, RunValue, Step, StepDependency, ToolServer
from ..record import canonical, chain, journaling, sql
from ..record.canonical import to_ijson
from ..record.journaling import Prepared
from ..undo import dependencies
from . import record
from .runs import IDLE_KEY

# Where the number goes in a `call` entry's JCS bytes, and the links in a `result` entry's, written before the
# run's lock decides them.
_NUMBER = b"\x00number\x00"
_LINKS = b"\x00links\x00"


def available() -> bool:
    """Whether transitions are journaled as one statement here: on PostgreSQL, unless turned off."""
    return connection.vendor == "postgresql" and settings.RECORDER_ONE_STATEMENT


def open_agent_call(*, agent: Agent, run_key: str, server: ToolServer, tool: str, call: Prepared,
                    decision: dict[str, Any] | None, entry: dict[str, bytes],
                    now: datetime) -> tuple[int, int, int, str] | None:
    """The intent of an agent's call journaled as one statement (see the module): (step id, run id, step
    number, the run's public id), or None when a check of the usual way applies and nothing was written.
    `entry` is the `call` entry's members but those the lock decides (`journaling.call_entry_decided`),
    `decision` what the policy decided without an earlier attempt: the statement holds only if there is
    none whose outcome is unknown."""
    written = {**entry, **canonical.members(to_ijson(journaling.call_entry_decided(number=0,
                                                                                    decision=decision))),
               "step": _NUMBER}
    before, _, after = canonical.joined(written).partition(_NUMBER)
    step = journaling.step_columns(call, server=server, server_name=server.name, tool=tool, now=now,
                                   status=journaling.opening_status(decision), decision=decision)
    where, where_params = _run_where(agent, run_key, now)
    params = [*where_params, agent.pk, call.guarded, call.digest, sql.json_row(Step, step), before.decode(),
              after.decode(), chain.format_ts(now), now]
    with transaction.atomic():
        row = sql.one_row(_open_sql(where), params)
        if row is None or row[3] is None:
            return None
        run_id, public_id, checkpointed, step_id, number, seq, head = row
        sql.remember(("agent run", agent.pk, run_key), run_id)
        _moved(run_id, public_id, checkpointed, seq, head, now)
    return step_id, run_id, number, record.remember_public_id(run_id, public_id)


def close_call(*, run_id: int, closing, finished: datetime) -> Step | None | bool:
    """The outcome of a call journaled as one statement (see the module): the closed step, None when the
    step was closed already (a late outcome changes nothing), or False when a check of the usual way applies
    and nothing was written. `closing` is `steps.prepare_close`'s."""
    step = closing.step
    if journaling.declared_dependencies(step.request_meta, before=step.number):
        return False
    failed, counter = journaling.counters(status=step.status, reversibility=step.reversibility,
                                          acted=closing.acted)
    statement = _close_sql(tuple(closing.fields), closing.has_result, failed, counter or "")
    before, _, after = canonical.joined({**closing.entry, "dependsOn": _LINKS}).partition(_LINKS)
    indexed = sorted(closing.indexed.items())
    params = [run_id, *sql.prepared_values(Step, closing.fields), step.pk,
              [digest for digest, _ in closing.wanted], [pointer for _, pointer in closing.wanted], step.pk,
              [digest for digest, _ in indexed], [pointer for _, pointer in indexed],
              chain.format_ts(finished), before.decode(), after.decode(), finished]
    with transaction.atomic():
        row = sql.one_row(statement, params)
        if row is None or not row[0]:
            return False
        _, step_id, public_id, checkpointed, seq, head = row
        if step_id is None:
            return None
        _moved(run_id, public_id, checkpointed, seq, head, finished)
    if closing.has_result:
        step.result_seq = seq
    return step


def _moved(run_id: int, public_id, checkpointed: int, seq: int, head: str, now: datetime) -> None:
    """After a statement moved the run's head: a copy of the run the journal group kept is stale, and a
    checkpoint that fell due is signed now (the caller holds the run's lock in the same transaction)."""
    sql.remember(("run", run_id), None)
    if seq - checkpointed >= settings.RECORDER_CHECKPOINT_EVERY:
        run = Run(pk=run_id, public_id=public_id, head_seq=seq, head_hash=head, checkpointed_seq=checkpointed,
                  state=Run.State.ACTIVE)
        record.sign_checkpoint(run=run, now=now)
        sql.update(Run, run_id, {"checkpointed_seq": seq})


def _run_where(agent: Agent, key: str, now: datetime) -> tuple[str, list[Any]]:
    """How the statement finds the agent's run for `key` (as `steps._find_run` does), and its parameters."""
    if (found := sql.recalled(("agent run", agent.pk, key))) is not None:
        return "id", [found]
    if key and not key.startswith(IDLE_KEY):
        return "key", [agent.pk, key]
    idle = now - timedelta(seconds=settings.RECORDER_RUN_IDLE_SECONDS)
    return "idle", [agent.pk, key, idle]


_WHERE = {
    "id": "r.id = %s",
    "key": 'r.agent_id = %s AND r."key" = %s',
    "idle": 'r.agent_id = %s AND r."key" = %s AND r.last_activity_at >= %s AND r.ended_at IS NULL '
            "ORDER BY r.last_activity_at DESC LIMIT 1",
}
# The statuses of an earlier attempt of the same call that may have acted (`steps.unknown_attempt`).
_ATTEMPTED = ", ".join(f"'{status}'" for status in (Step.Status.OK, Step.Status.ERROR,
                                                    Step.Status.UNDELIVERED, Step.Status.CANCELLED))


def _hash_of(event: str) -> str:
    """SQL for the hash of an entry appended on the run `go` at `go.head_seq + 1`, its data and timestamp
    `written.data` and `written.ts`: `chain._whole`'s bytes (the data, then the members in JCS's order)."""
    return (f"""encode(sha256(convert_to('{{"data":' || written.data || ',"event":"{event}","prevHash":"' """
            """|| go.head_hash || '","seq":' || (go.head_seq + 1) || ',"ts":"' || written.ts || '"}', """
            "'UTF8')), 'hex')")


def _column(attname: str) -> str:
    """A step field's column, quoted, by its attname (`run_id`; `task_id` is a field's own name)."""
    column = next(f.column for f in Step._meta.concrete_fields if f.attname == attname)
    return connection.ops.quote_name(column)


@cache
def _open_sql(where: str) -> str:
    """The intent's statement for a run found `where`. The step's columns come in one parameter, a JSON
    object (`sql.json_row`): a statement of fifty parameters is parsed again by psycopg at every call."""
    q = connection.ops.quote_name
    run_t, step_t, entry_t = (q(m._meta.db_table) for m in (Run, Step, ChainEntry))
    names = [f.attname for f in Step._meta.concrete_fields
             if not f.primary_key and f.attname not in ("run_id", "number")]
    columns = ", ".join(_column(name) for name in ("run_id", "number", *names))
    values = ", ".join(["go.id", "go.step_count + 1", *(f"p.{_column(name)}" for name in names)])
    return f"""
WITH run AS (
    SELECT r.id, r.public_id, r.step_count, r.head_seq, r.head_hash, r.checkpointed_seq, r.state,
           r.halted_by_plan
    FROM {run_t} r WHERE {_WHERE[where]} FOR UPDATE
), go AS (
    SELECT run.* FROM run
    WHERE run.state <> '{Run.State.IMPORTED}' AND run.halted_by_plan = ''
      AND NOT EXISTS (SELECT 1 FROM {q(Agent._meta.db_table)} a WHERE a.id = %s AND a.halted_by_plan <> '')
      AND (NOT %s::boolean OR (
          SELECT s.may_have_acted FROM {step_t} s
          WHERE s.call_digest = %s AND s.status IN ({_ATTEMPTED})
            AND s.failure_class <> '{Step.FailureClass.POLICY}'
            AND NOT (s.status = '{Step.Status.CANCELLED}' AND NOT s.may_have_acted)
          ORDER BY s.id DESC LIMIT 1) IS NOT TRUE)
), step AS (
    INSERT INTO {step_t} ({columns})
    SELECT {values} FROM go, jsonb_populate_record(NULL::{step_t}, %s::jsonb) p RETURNING id, number
), written AS (
    SELECT %s::text || (go.step_count + 1) || %s::text AS data, %s::text AS ts FROM go
), entry AS (
    INSERT INTO {entry_t} (run_id, seq, ts, event, data, prev_hash, hash)
    SELECT go.id, go.head_seq + 1, written.ts, 'call', written.data::jsonb, go.head_hash, {_hash_of("call")}
    FROM go, written RETURNING seq, hash
), moved AS (
    UPDATE {run_t} SET step_count = go.step_count + 1, head_seq = entry.seq, head_hash = entry.hash,
                       last_activity_at = %s
    FROM go, entry WHERE {run_t}.id = go.id RETURNING {run_t}.id
)
SELECT run.id, run.public_id, run.checkpointed_seq, (SELECT id FROM step), (SELECT number FROM step),
       (SELECT seq FROM entry), (SELECT hash FROM entry)
FROM run"""


@cache
def _close_sql(names: tuple[str, ...], has_result: bool, failed: bool, counter: str) -> str:
    """The outcome's statement, for a step whose closed fields are `names`, moving the run's counters as
    `steps.count` does (`failed`, and the counter it adds one to, if any)."""
    q = connection.ops.quote_name
    run_t, step_t, entry_t, value_t, link_t = (q(m._meta.db_table)
                                               for m in (Run, Step, ChainEntry, RunValue, StepDependency))
    sets = [f"{_column(name)} = %s" for name in names]
    if has_result:
        sets.append(f"{_column('result_seq')} = go.head_seq + 1")
    moves = ["head_seq = entry.seq", "head_hash = entry.hash", "last_activity_at = %s"]
    if failed:
        moves += ["failed_count = go.failed_count + 1", f"state = '{Run.State.FAILED}'"]
    if counter:
        moves.append(f"{q(counter)} = go.{q(counter)} + 1")
    return f"""
WITH run AS (
    SELECT r.* FROM {run_t} r WHERE r.id = %s FOR UPDATE
), go AS (
    SELECT run.* FROM run WHERE run.state <> '{Run.State.IMPORTED}'
), step AS (
    UPDATE {step_t} SET {", ".join(sets)} FROM go
    WHERE {step_t}.id = %s AND {step_t}.status = '{Step.Status.PENDING}' RETURNING {step_t}.id
), hit AS (
    SELECT v.step_id, v.pointer AS source, w.pointer AS target, w.n
    FROM go, unnest(%s::varchar[], %s::varchar[]) WITH ORDINALITY AS w(digest, pointer, n)
    JOIN {value_t} v ON v.digest = w.digest
    WHERE v.run_id = go.id AND v.step_id <> %s AND v.seen <= {dependencies.COMMON_AFTER}
), found AS (
    SELECT hit.step_id, earlier.number,
           jsonb_agg(jsonb_build_object('from', hit.source, 'to', hit.target) ORDER BY hit.n) AS pointers,
           string_agg('{{"from":' || to_json(hit.source)::text || ',"to":' || to_json(hit.target)::text
                      || '}}', ',' ORDER BY hit.n) AS written
    FROM hit JOIN {step_t} earlier ON earlier.id = hit.step_id
    WHERE hit.step_id IN (SELECT DISTINCT step_id FROM hit ORDER BY step_id DESC
                          LIMIT {dependencies.MAX_LINKS})
    GROUP BY hit.step_id, earlier.number
), linked AS (
    INSERT INTO {link_t} (step_id, depends_on_id, rule, pointers)
    SELECT step.id, found.step_id, '{StepDependency.Rule.INFERRED}', found.pointers FROM step, found
), indexed AS (
    INSERT INTO {value_t} (run_id, digest, step_id, pointer, seen)
    SELECT go.id, v.digest, step.id, v.pointer, 1
    FROM go, step, unnest(%s::varchar[], %s::varchar[]) AS v(digest, pointer)
    ON CONFLICT (run_id, digest) DO UPDATE
        SET step_id = excluded.step_id, pointer = excluded.pointer, seen = {value_t}.seen + 1
), written AS (
    SELECT %s::text AS ts,
           %s::text || '[' || COALESCE((SELECT string_agg('{{"pointers":[' || found.written
                                                         || '],"rule":"inferred","step":' || found.number
                                                         || '}}', ',' ORDER BY found.step_id)
                                        FROM found), '') || ']' || %s::text AS data
), entry AS (
    INSERT INTO {entry_t} (run_id, seq, ts, event, data, prev_hash, hash)
    SELECT go.id, go.head_seq + 1, written.ts, 'result', written.data::jsonb, go.head_hash,
           {_hash_of("result")}
    FROM go, step, written RETURNING seq, hash
), moved AS (
    UPDATE {run_t} SET {", ".join(moves)} FROM go, entry WHERE {run_t}.id = go.id RETURNING {run_t}.id
)
SELECT EXISTS (SELECT 1 FROM go), (SELECT id FROM step), run.public_id, run.checkpointed_seq,
       (SELECT seq FROM entry), (SELECT hash FROM entry)
FROM run"""
