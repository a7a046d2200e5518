"""The chain of a run: appending events, signing checkpoints, and the run row's moving columns.

Every writer here holds the run's row lock while it appends (see `append_entry`).
"""

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ..errors import Refused
from ..models import Agent, ChainEntry, Checkpoint, Run, Step, Team
from ..record import chain, keys, sql


class ForeignRun(Refused):
    """A write to an imported run's chain: it is another Recorder's signed record, kept as it came."""

# The run columns a call reads and moves. They are integers and text, so the hot path reads them raw
# (`sql.locked_row`) and writes back only these (`save_moving`), which keeps each transaction small.
RUN_MOVING_FIELDS = (
    "step_count", "head_seq", "head_hash", "checkpointed_seq", "state",
    "reversible_count", "irreversible_count", "unknown_count", "failed_count",
)
_RUN_LOCKED_FIELDS = ("id", *RUN_MOVING_FIELDS, "halted_by_plan")


_PUBLIC_IDS: dict[int, str] = {}


def public_id_of(run_id: int) -> str:
    """The public id of run `run_id` (read once per run and process: it never changes)."""
    found = _PUBLIC_IDS.get(run_id)
    if found is None:
        value = Run.objects.filter(pk=run_id).values_list("public_id", flat=True).first()
        found = remember_public_id(run_id, value) if value is not None else ""
    return found


def remember_public_id(run_id: int, public_id: Any) -> str:
    """Keep a run's public id, read with something else, for `public_id_of`; the id as text."""
    found = str(public_id)
    if len(_PUBLIC_IDS) >= 100_000:
        _PUBLIC_IDS.clear()
    _PUBLIC_IDS[run_id] = found
    return found


def locked_run_by_id(run_id: int) -> Run | None:
    """The run `run_id`, row-locked. Inside a journal group (`sql.one_moment`) a run the group has locked
    already is the same object, as its last job left it: the lock holds until the group commits, so nothing
    else can have changed it, and every writer here saves what it changes (`save_moving`)."""
    if (held := sql.recalled(("run", run_id))) is not None:
        return held
    return locked_run("id = %s", [run_id])


def locked_run(where: str, params: list[Any]) -> Run | None:
    """The run matching `where`, row-locked, and kept for the rest of a journal group (`locked_run_by_id`)."""
    run = sql.locked_row(Run, _RUN_LOCKED_FIELDS, where, params)
    if run is not None:
        sql.remember(("run", run.pk), run)
    return run


def save_moving(run: Run, *, now: datetime | None) -> None:
    """Write back the moving columns; `now` is the agent's latest activity (None for events that are not
    the agent's, such as a plan, which must not keep an idle run alive)."""
    values = {name: getattr(run, name) for name in RUN_MOVING_FIELDS}
    sql.update(Run, run.pk, values if now is None else {**values, "last_activity_at": now})


def open_run(
    *, agent: Agent | None, key: str, now: datetime, label: str = "", started_at: datetime | None = None,
    team: Team | None = None,
) -> Run:
    """Create a run with its header as its first entry (inside the caller's transaction, so a run never
    exists without it): the agent (or `label` for a run that is not an agent's), its person, the start and
    this Recorder, all covered by the chain's signatures. It belongs to its agent's team, else to `team`,
    else to the default team."""
    started_at = started_at or now
    team_id = agent.team_id if agent else (team or Team.objects.default()).pk
    run = Run.objects.create(
        agent=agent, key=key, started_at=started_at, last_activity_at=now, agent_label=label, team_id=team_id
    )
    append_entry(
        run=run,
        event=chain.HEADER_EVENT,
        now=now,
        data=chain.header(
            run=str(run.public_id),
            agent=agent.name if agent else label,
            on_behalf_of=agent.on_behalf_of.get_username() if agent else None,
            started_at=chain.format_ts(started_at),
            recorder=settings.PUBLIC_URL,
        ),
    )
    run.save(update_fields=["head_seq", "head_hash", "checkpointed_seq"])
    return run


def _refuse_if_foreign(run: Run) -> None:
    if run.state == Run.State.IMPORTED:
        raise ForeignRun(
            f"Run {run.pk} was imported: its record is kept as it came, and nothing here adds to it."
        )


def append_entry(
    *, run: Run, event: str, data: Any = None, now: datetime, written: bytes | None = None
) -> int:
    """Append one event to a run's chain.

    The caller holds a transaction and the run's row lock (`locked_run`, or `select_for_update`): the lock
    serialises writers on one run across processes, and the unique (run, seq) constraint is the backstop if
    anyone ever forgets it. The caller saves the run's head afterwards (`save_moving`). An imported run is
    never written to (`ForeignRun`). Returns the new entry's seq; its data is stored as the JCS text it was
    hashed from. The insert reads nothing back, so in a journal group (`sql.pipelined`) it goes to the
    server with the next statement that does. `written` is the data already written in JCS (its bytes),
    instead of `data`: only the entry's own members are written and hashed here, under the lock.
    """
    _refuse_if_foreign(run)
    seq, ts = run.head_seq + 1, chain.format_ts(now)
    if written is not None:
        entry, data_bytes = chain.written_entry(seq=seq, ts=ts, event=event, data_bytes=written,
                                                prev_hash=run.head_hash), written
    else:
        entry, data_bytes = chain.new_entry(seq=seq, ts=ts, event=event, data=data, prev_hash=run.head_hash)
    sql.insert(ChainEntry, {"run_id": run.pk, "seq": entry["seq"], "ts": entry["ts"], "event": event,
                            "data": sql.JsonText(data_bytes.decode("utf-8")),
                            "prev_hash": entry["prevHash"], "hash": entry["hash"]}, returning=False)
    run.head_seq, run.head_hash = entry["seq"], entry["hash"]
    if run.head_seq - run.checkpointed_seq >= settings.RECORDER_CHECKPOINT_EVERY:
        sign_checkpoint(run=run, now=now)
    return run.head_seq


def sign_checkpoint(*, run: Run, now: datetime) -> Checkpoint:
    """Sign the run's head as it is now (the caller holds the run's row lock and saves `checkpointed_seq`)."""
    _refuse_if_foreign(run)
    key_id, private = keys.signing_key()
    payload = chain.checkpoint_payload(run=str(run.public_id), seq=run.head_seq, head_hash=run.head_hash)
    values = {"run_id": run.pk, "seq": run.head_seq, "head_hash": run.head_hash, "key_id": key_id,
              "signature": chain.sign(private, payload), "created_at": now}
    checkpoint = Checkpoint(**values)
    checkpoint.pk = sql.insert(Checkpoint, values)
    run.checkpointed_seq = run.head_seq
    return checkpoint


def checkpoint_run(*, run: Run, now: datetime | None = None) -> Checkpoint | None:
    """Sign the run's current head, if anything was appended since the last checkpoint."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run.pk)
        if run.head_seq == run.checkpointed_seq or run.state == Run.State.IMPORTED:
            return None
        checkpoint = sign_checkpoint(run=run, now=now or timezone.now())
        run.save(update_fields=["checkpointed_seq"])
        return checkpoint


def record_event(*, run_id: int, event: str, data: Any, now: datetime) -> int:
    """Append an event from outside the Recorder (a plan, a check, an approval) to a run's chain; the new
    entry's seq.

    Runs inside the caller's transaction if there is one, so the event commits with the change it records."""
    with transaction.atomic():
        run = locked_run_by_id(run_id)
        entry = append_entry(run=run, event=event, data=data, now=now)
        save_moving(run, now=None)
    return entry



def step_result(step: Step) -> dict[str, Any] | None:
    """A step's whole result as the server sent it: from the run's record, where even a large one is kept
    (its `result` entry), or the step's own inline copy."""
    entry = step.run.entries.filter(seq=step.result_seq, event="result").first() if step.result_seq else None
    result = entry.data.get("result") if entry is not None and entry.data.get("step") == step.number else None
    result = result if isinstance(result, dict) else step.result
    return result if isinstance(result, dict) else None
