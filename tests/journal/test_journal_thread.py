"""The journal thread commits in groups: the jobs waiting at one moment share one transaction, without
savepoints; a job's result is handed back only once that transaction committed; if a job fails, the group is
rolled back and every job runs alone, in order, where a failing job undoes only its own writes; a failed
commit fails every job of its group; closing runs every queued job first."""

import asyncio
import threading

import pytest
from django.contrib.auth.models import Group
from django.db import IntegrityError, OperationalError, connection, transaction

from journal.auth import roles
from journal.mcp.journal_thread import JournalThread
from journal.record import sql

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def names() -> list[str]:
    """The groups the jobs wrote (not the roles the migrations made)."""
    return sorted(Group.objects.exclude(name__in=roles.ALL).values_list("name", flat=True))


def add(name: str) -> str:
    Group.objects.create(name=name)
    return name


def grouped(journal: JournalThread, *jobs, statements: list | None = None) -> list:
    """Hand `jobs` ((fn, kwargs) pairs) in while the thread is busy, so they wait together and run as one
    group; what each gave (or raised), in order, and how many commits the group took. The thread's
    statements from then on are added to `statements` when it is given."""
    commits, busy, release = [], threading.Event(), threading.Event()

    def hold() -> None:
        real = connection.commit
        connection.commit = lambda: (commits.append(1), real())[1]  # this thread's connection
        if statements is not None:
            connection.execute_wrappers.append(
                lambda execute, sql, params, many, context: (statements.append(sql),
                                                             execute(sql, params, many, context))[1])
        busy.set()
        release.wait(10)

    async def main():
        first = journal.submit(hold)
        await asyncio.to_thread(busy.wait, 10)
        futures = [journal.submit(fn, **kwargs) for fn, kwargs in jobs]
        release.set()
        await first
        return await asyncio.gather(*futures, return_exceptions=True)

    given = asyncio.run(main())
    journal.settle()
    return given, len(commits)


@pytest.fixture
def journal():
    thread = JournalThread()
    yield thread
    thread.close()


def test_jobs_waiting_together_commit_once_and_each_gets_its_own_result(journal):
    given, commits = grouped(journal, *[(add, {"name": f"g{n}"}) for n in range(20)])
    assert given == [f"g{n}" for n in range(20)] and names() == sorted(f"g{n}" for n in range(20))
    assert commits == 1  # twenty writes, one transaction


def test_a_group_makes_no_savepoints_even_for_the_atomic_blocks_of_its_jobs(journal):
    def in_its_own_block(name) -> str:
        with transaction.atomic():
            return add(name)

    statements = []
    given, commits = grouped(journal, *[(in_its_own_block, {"name": f"s{n}"}) for n in range(5)],
                             statements=statements)
    assert given == [f"s{n}" for n in range(5)] and commits == 1
    assert len([sql for sql in statements if "INSERT" in sql]) == 5
    assert not [sql for sql in statements if "SAVEPOINT" in sql.upper()]


def test_a_job_that_handles_a_failure_with_its_own_savepoint_still_gets_its_result(journal):
    add("taken")

    def create_or_get(name) -> str:  # as the Recorder opens a run another process may have just created
        try:
            with transaction.atomic():
                add(name)
        except IntegrityError:
            return f"{Group.objects.get(name=name).name} (found)"
        return name

    given, _ = grouped(journal, (add, {"name": "a"}), (create_or_get, {"name": "taken"}),
                       (add, {"name": "b"}))
    assert given == ["a", "taken (found)", "b"] and names() == ["a", "b", "taken"]


def test_a_statement_that_fails_after_its_job_returned_fails_only_that_job(journal):
    # An insert that reads nothing back is sent with the next statement that does (on PostgreSQL, in
    # pipeline mode), so its error surfaces later, in another job or at the end of the group.
    def insert_unread(name) -> str:
        sql.insert(Group, {"name": name}, returning=False)
        return name

    given, _ = grouped(journal, (insert_unread, {"name": "p"}), (insert_unread, {"name": "p"}),
                       (insert_unread, {"name": "q"}))
    assert given[0] == "p" and isinstance(given[1], IntegrityError) and given[2] == "q"
    assert names() == ["p", "q"]


def test_a_result_is_handed_back_only_once_its_group_committed(journal):
    busy, inside, release_busy, release_last = (threading.Event() for _ in range(4))

    def hold() -> None:
        busy.set()
        release_busy.wait(10)

    def last() -> None:
        inside.set()  # `first` has run, in this group's transaction, not yet committed
        release_last.wait(10)

    async def main():
        held = journal.submit(hold)
        await asyncio.to_thread(busy.wait, 10)
        first, slow = journal.submit(add, name="first"), journal.submit(last)
        release_busy.set()
        await held
        await asyncio.to_thread(inside.wait, 10)
        await asyncio.sleep(0.05)
        before = first.done()
        release_last.set()
        await slow
        return before, await first

    assert asyncio.run(main()) == (False, "first")


def test_a_failing_job_undoes_only_its_own_writes_and_gets_its_own_error(journal):
    def fails() -> None:
        with transaction.atomic():  # as every journal job writes
            add("half-done")
            raise ValueError("this job broke")

    given, _ = grouped(journal, (add, {"name": "a"}), (fails, {}), (add, {"name": "b"}))
    assert given[0] == "a" and given[2] == "b" and isinstance(given[1], ValueError)
    assert names() == ["a", "b"]


def test_after_a_job_that_fails_on_the_database_every_job_runs_alone_in_order(journal):
    attempts, order = [], []

    def deadlocked_once() -> str:
        add("retried")
        attempts.append(1)
        if len(attempts) == 1:
            raise OperationalError("deadlock detected")  # another process's group held the lock
        return "retried"

    def after(name) -> str:
        order.append((name, Group.objects.filter(name="retried").exists()))
        return add(name)

    given, _ = grouped(journal, (add, {"name": "before"}), (deadlocked_once, {}), (after, {"name": "then"}),
                       (add, {"name": "duplicate"}))
    assert given == ["before", "retried", "then", "duplicate"] and len(attempts) == 2
    assert order == [("then", True)]  # it ran after the retried job, as it was handed in
    assert names() == ["before", "duplicate", "retried", "then"]  # the first attempt's row was undone
    given, _ = grouped(journal, (add, {"name": "c"}), (add, {"name": "before"}), (add, {"name": "d"}))
    assert given[0] == "c" and isinstance(given[1], IntegrityError) and given[2] == "d"


def test_a_commit_that_fails_fails_every_job_of_its_group_and_writes_nothing(journal):
    def breaks_the_commit() -> None:
        real = connection.commit

        def fails():
            connection.commit = real  # once
            raise OperationalError("disk I/O error")

        connection.commit = fails

    given, _ = grouped(journal, (add, {"name": "x"}), (breaks_the_commit, {}), (add, {"name": "y"}))
    assert all(isinstance(g, OperationalError) for g in given) and names() == []
    assert asyncio.run(_one(journal, add, name="z")) == "z" and names() == ["z"]  # it reconnects


async def _one(journal, fn, **kwargs):
    return await journal.submit(fn, **kwargs)


def test_closing_runs_every_queued_job_first():
    journal = JournalThread()

    async def main():
        for n in range(50):
            journal.submit(add, name=f"q{n}")

    asyncio.run(main())
    journal.close()
    assert len(names()) == 50
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(_one(journal, add, name="late"))
