"""A Recorder killed (SIGKILL, every process of it) while an agent's SQL call runs on the database: the
statement commits on PostgreSQL all the same (the server-side session finishes it), the call's window was
never read, and the step's answer never recorded. Nothing is silent: the reconciler closes the step as one
that may have acted, and the capture's sweep finds the rows it changed as changed by no recorded call, on
the server's page and as an audit notice, never pruned unseen."""

import os
import signal
import threading
import time

import anyio
import httpx2
import psycopg
import pytest
from django.utils import timezone
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from journal import services as journal_services
from journal.models import Notice, Step, ToolServer
from tests.conftest import free_port
from tests.journal.undo.databases import AGENT_ROLE, dbhub_crm, pg_rows, postgres_crm
from tests.operations.test_audit import start_recorder
from tests.services import POSTGRES_URL, needs_node, needs_postgres, worker_env_for_test_database

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True), needs_postgres, needs_node]

SLOW = "UPDATE contacts SET status = 'killed' WHERE id <= 7 AND (SELECT count(*) FROM pg_sleep(3)) = 1"


def sql_call(url: str, token: str) -> None:
    """The agent's call, through the Recorder: it never hears back (the Recorder is killed under it)."""
    async def call():
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
            async with Client(streamable_http_client(url, http_client=http), cache=None) as client:
                await client.call_tool("crm__execute_sql", {"sql": SLOW})

    try:
        anyio.run(call)
    except BaseException:  # noqa: BLE001 - the Recorder is gone: the agent's call fails, as it must
        pass


def test_a_recorder_killed_while_an_sql_call_runs_leaves_its_rows_to_the_sweep_never_to_silence(
        admin_user, dana, settings):
    settings.RECORDER_CAPTURE_SWEEP_LAG_SECONDS = 0
    with postgres_crm(POSTGRES_URL) as (recorder_url, agent_url):
        dbhub_crm(recorder_url, agent_url, by=admin_user)
        token = journal_services.create_agent(name="cleanup-bot", on_behalf_of=dana)[1]
        port = free_port()
        recorder = start_recorder(worker_env_for_test_database(), port)
        try:
            agent = threading.Thread(target=sql_call, args=(f"http://127.0.0.1:{port}/mcp/", token))
            agent.start()
            deadline = time.monotonic() + 30
            while not pg_rows(recorder_url, "SELECT count(*) FROM pg_stat_activity WHERE usename = %s AND "
                              "query LIKE 'UPDATE contacts%%' AND state = 'active'", AGENT_ROLE)[0][0]:
                assert time.monotonic() < deadline, "the call never reached the database"
                time.sleep(0.05)
        finally:
            os.killpg(recorder.pid, signal.SIGKILL)
            recorder.wait(timeout=20)
        agent.join(timeout=60)
        deadline = time.monotonic() + 30
        while pg_rows(recorder_url, "SELECT count(*) FROM contacts WHERE status = 'killed'") != [(7,)]:
            assert time.monotonic() < deadline, "the statement did not commit"
            time.sleep(0.2)
        [step] = Step.objects.filter(arguments__sql=SLOW)
        assert step.status == "pending" and step.earlier_state["database"]["reading"]["kind"] == "rows"
        assert journal_services.reconcile_stale_steps(older_than=timezone.now()) == 1
        step.refresh_from_db()
        assert step.may_have_acted and step.error_message == (
            "The Recorder stopped before the tool server's answer was recorded.")
        server = ToolServer.objects.get(name="crm")
        journal_services.sweep_capture(server=server)
        assert journal_services.prune_capture(server=server) == 0  # the second sweep, then nothing to forget
        server.refresh_from_db()
        [finding] = server.unrecorded
        assert (finding["rows"], finding["tables"], finding["roles"]) == (
            7, {"public.contacts": 7}, [AGENT_ROLE])
        words = "7 rows of public.contacts changed by no recorded call to crm"
        assert Notice.objects.get().data["words"] == words
        with psycopg.connect(recorder_url, autocommit=True) as connection:  # every row still in the capture
            assert connection.execute("SELECT count(*) FROM undo_capture.changes").fetchone() == (7,)
