"""Registering a tool server in the admin reads its catalogue after the save commits."""

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from journal.models import ToolServer

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
