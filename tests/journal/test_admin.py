"""Registering a tool server in the admin reads its catalogue after the save commits; a stdio server's command
comes from the settings' allowlist, never typed there."""

import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from journal.models import ChainEntry, Run, Step, ToolServer

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_admin_registers_a_tool_server_and_its_catalogue_is_read(client, sample_servers):
    admin = User.objects.create_superuser("root", password="root-password-1")
    client.force_login(admin)
    response = client.post(reverse("admin:journal_toolserver_add"), {
        "name": "crm", "transport": "http", "url": sample_servers.url("crm"), "command": "", "enabled": "on",
        "created_at_0": "2026-11-29", "created_at_1": "10:00:00"}, follow=True)
    assert response.status_code == 200
    server = ToolServer.objects.get(name="crm")
    assert "update_deal" in server.tool_names and server.catalogue_fetched_at is not None
    assert "rm: 4 tools read." in response.content.decode()  # the admin capitalises messages


def test_a_stdio_server_without_a_command_is_refused_with_a_clear_error(client):
    admin = User.objects.create_superuser("root", password="root-password-1")
    client.force_login(admin)
    response = client.post(reverse("admin:journal_toolserver_add"), {
        "name": "clock", "transport": "stdio", "url": "", "command": "", "enabled": "on",
        "created_at_0": "2026-11-29", "created_at_1": "10:00:00"})
    assert response.status_code == 200 and "A stdio server needs a command." in response.content.decode()
    assert not ToolServer.objects.exists()


def test_non_staff_roles_cannot_open_the_admin(client, on_call, approver_user):
    for user in (on_call, approver_user):
        client.force_login(user)
        response = client.get(reverse("admin:journal_toolserver_changelist"))
        assert response.status_code == 302 and "/admin/login/" in response.url


def test_the_admin_cannot_type_a_command_for_a_stdio_server(client, settings, tmp_path):
    """A command runs as the Recorder's user: `sh -c 'id > …'` typed in the admin once ran, as root."""
    admin = User.objects.create_superuser("root", password="root-password-1")
    client.force_login(admin)
    planted = tmp_path / "planted"
    response = client.post(
        reverse("admin:journal_toolserver_add"),
        {
            "name": "evil",
            "transport": "stdio",
            "url": "",
            "command": f"sh -c 'id > {planted}'",
            "enabled": "on",
            "created_at_0": "2026-11-29",
            "created_at_1": "10:00:00",
        },
    )
    assert response.status_code == 200 and "Select a valid choice" in response.content.decode()
    assert not ToolServer.objects.exists() and not planted.exists()


def test_the_admin_picks_a_command_from_the_settings_allowlist_and_keeps_one_a_shell_set(client, settings):
    clock = f"{Path(sys.executable).parent / 'mcp-server-time'}"
    settings.RECORDER_STDIO_COMMANDS = [clock]
    admin = User.objects.create_superuser("root", password="root-password-1")
    client.force_login(admin)
    form = client.get(reverse("admin:journal_toolserver_add")).content.decode()
    assert f'<option value="{clock}">' in form and "sh -c" not in form
    response = client.post(reverse("admin:journal_toolserver_add"), {
        "name": "clock", "transport": "stdio", "url": "", "command": clock, "enabled": "on",
        "created_at_0": "2026-11-29", "created_at_1": "10:00:00"}, follow=True)
    assert response.status_code == 200
    assert ToolServer.objects.get(name="clock").command == clock

    # A command set from a shell stays as it is when the admin edits something else, and cannot be changed.
    settings.RECORDER_STDIO_COMMANDS = []
    server = ToolServer.objects.get(name="clock")
    change = reverse("admin:journal_toolserver_change", args=[server.pk])
    fields = {"name": "clock", "transport": "stdio", "url": "", "enabled": "", "created_at_0": "2026-11-29",
              "created_at_1": "10:00:00"}
    assert client.post(change, {**fields, "command": "sh -c 'id'"}).status_code == 200
    assert (
        ToolServer.objects.get(pk=server.pk).command == clock and ToolServer.objects.get(pk=server.pk).enabled
    )
    client.post(change, {**fields, "command": clock})
    assert (
        ToolServer.objects.get(pk=server.pk).command == clock
        and not ToolServer.objects.get(pk=server.pk).enabled
    )


def test_nobody_changes_or_deletes_the_run_record_in_the_admin_superusers_included(client, globex):
    client.force_login(User.objects.create_superuser("root", password="root-password-1"))
    step, entry = Step.objects.filter(run=globex).first(), ChainEntry.objects.filter(run=globex).first()
    entries = ChainEntry.objects.filter(run=globex).count()
    for model, row in (("run", globex), ("step", step), ("chainentry", entry)):
        assert client.get(reverse(f"admin:journal_{model}_changelist")).status_code == 200  # shown
        assert (
            client.post(reverse(f"admin:journal_{model}_delete", args=[row.pk]), {"post": "yes"}).status_code
            == 403
        )
        assert client.post(reverse(f"admin:journal_{model}_change", args=[row.pk]), {}).status_code == 403
        assert client.get(reverse(f"admin:journal_{model}_add")).status_code == 403
    listed = client.post(reverse("admin:journal_run_changelist"), {
        "action": "delete_selected", "_selected_action": [globex.pk], "post": "yes"})
    assert listed.status_code in (200, 302)  # no such action is offered
    assert (
        Run.objects.filter(pk=globex.pk).exists() and ChainEntry.objects.filter(run=globex).count() == entries
    )
