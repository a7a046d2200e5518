"""psycopg's connection pool (`DATABASE_POOL`): the Recorder journals and the pages read through it, with more
requests at once than it has connections; a setting it cannot work with is refused when the process starts."""

import os
import subprocess
import sys

import anyio
import httpx2
import pytest
from django.contrib.sessions.backends.db import SessionStore
from django.db import connection

from journal import services as journal_services
from journal.models import Run, Step
from samples import agent as scripted
from tests.journal.helpers import register_samples
from tests.operations.test_metrics import recorders
from tests.services import worker_env_for_test_database

pytestmark = pytest.mark.django_db(transaction=True)


def signed_in(user) -> str:
    """A session cookie's value for `user`, as the login page would have made it."""
    session = SessionStore()
    session.update({"_auth_user_id": str(user.pk), "_auth_user_hash": user.get_session_auth_hash(),
                    "_auth_user_backend": "django.contrib.auth.backends.ModelBackend"})
    session.create()
    return session.session_key


@pytest.mark.postgres
def test_with_a_pool_the_recorder_journals_and_the_pages_read(sample_servers, dana, on_call, tmp_path):
    register_samples(sample_servers)
    _, token = journal_services.create_agent(name="sales-bot", on_behalf_of=dana)
    env = {**worker_env_for_test_database(), "METRICS_DIR": str(tmp_path / "metrics")}
    if connection.vendor == "postgresql":  # on SQLite (which has no pool), the same without one
        env["DATABASE_POOL"] = "1"
    with recorders(env, workers=2) as base:
        anyio.run(lambda: scripted.replay(f"{base}/mcp/", token, say=lambda _: None))
        cookie = signed_in(on_call)

        async def pages():  # twelve at once, two processes of one connection for requests each: most wait
            async with httpx2.AsyncClient(cookies={"sessionid": cookie}, timeout=30) as http:
                answers = []
                async with anyio.create_task_group() as group:
                    for _ in range(12):
                        group.start_soon(lambda: _get(http, f"{base}/runs/", answers))
                return answers

        answers = anyio.run(pages)

    assert [answer.status_code for answer in answers] == [200] * 12
    assert all("sales-bot" in answer.text for answer in answers)
    run = Run.objects.get(agent__name="sales-bot")
    assert journal_services.verify_run(run=run).ok
    steps = Step.objects.filter(run=run)
    assert steps.count() == run.step_count > 0
    assert not steps.filter(status=Step.Status.PENDING).exists()  # every call's outcome journaled


async def _get(http, url: str, answers: list) -> None:
    answers.append(await http.get(url))


@pytest.mark.parametrize(("database", "problem"), [
    ({}, "DATABASE_POOL is for PostgreSQL"),
    ({"DATABASE_URL": "postgres://u:p@localhost/db", "DATABASE_CONN_MAX_AGE": "60"},
     "with DATABASE_CONN_MAX_AGE left at 0"),
])
def test_a_pool_it_cannot_keep_is_refused_when_the_process_starts(database, problem, tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    env.update({"DJANGO_SETTINGS_MODULE": "approver.settings", "VAR_DIR": str(tmp_path),
                "DATABASE_POOL": "4", **database})
    started = subprocess.run([sys.executable, "-c", "import django; django.setup()"], env=env,
                             capture_output=True, text=True, timeout=60)
    assert started.returncode != 0
    assert problem in started.stderr
