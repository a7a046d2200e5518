"""Migrations that move data keep it."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone


@pytest.mark.django_db(transaction=True)
def test_the_value_index_keeps_each_runs_most_recent_step_and_how_often_it_was_seen():
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes()
    before, after = [("journal", "0006_step_result_storage")], [("journal", "0007_run_value")]
    try:
        carried_over(executor, before, after)
    finally:  # every later test runs on the whole schema
        MigrationExecutor(connection).migrate(latest)


def carried_over(executor, before, after):
    executor.migrate(before)
    old = executor.loader.project_state(before).apps
    user = old.get_model("auth", "User").objects.create(username="dana")
    agent = old.get_model("journal", "Agent").objects.create(
        name="bot", on_behalf_of_id=user.pk, token_hash="x"
    )
    run = old.get_model("journal", "Run").objects.create(agent=agent, key="run:r")
    Step = old.get_model("journal", "Step")
    first, second = (
        Step.objects.create(run=run, number=n, tool="echo", started_at=timezone.now()) for n in (1, 2)
    )
    ResultValue = old.get_model("journal", "ResultValue")
    for step, pointer in ((first, "/structuredContent/a"), (first, "/structuredContent/b"),
                          (second, "/structuredContent/c")):
        ResultValue.objects.create(run=run, step=step, digest="same", pointer=pointer)
    ResultValue.objects.create(run=run, step=first, digest="once", pointer="/structuredContent/d")
    executor = MigrationExecutor(connection)
    executor.migrate(after)
    new = executor.loader.project_state(after).apps
    kept = {
        v.digest: (v.step_id, v.pointer, v.seen) for v in new.get_model("journal", "RunValue").objects.all()
    }
    assert kept == {
        "same": (second.pk, "/structuredContent/c", 2),
        "once": (first.pk, "/structuredContent/d", 1),
    }


@pytest.mark.django_db(transaction=True)
def test_an_existing_installation_gets_one_team_holding_every_agent_and_run_that_counts_everyone(settings):
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes()
    before, after = [("journal", "0033_tool_server_database")], [("journal", "0034_teams")]
    try:
        executor.migrate(before)
        old = executor.loader.project_state(before).apps
        user = old.get_model("auth", "User").objects.create(username="dana")
        agent = old.get_model("journal", "Agent").objects.create(name="bot", on_behalf_of_id=user.pk,
                                                                 token_hash="x")
        Run = old.get_model("journal", "Run")
        runs = [Run.objects.create(agent=agent, key="run:r").pk,
                Run.objects.create(agent=None, agent_label="chronomcp").pk]
        executor = MigrationExecutor(connection)
        executor.migrate(after)
        new = executor.loader.project_state(after).apps
        team = new.get_model("journal", "Team").objects.get()
        assert (team.name, team.everyone) == (settings.DEFAULT_TEAM, True)
        assert new.get_model("journal", "Agent").objects.get().team_id == team.pk
        assert set(new.get_model("journal", "Run").objects.filter(pk__in=runs).values_list(
            "team_id", flat=True)) == {team.pk}
    finally:
        MigrationExecutor(connection).migrate(latest)
