import os
import subprocess
import sys
import time

import pytest
from django.urls import reverse

from tests.services import REDIS_URL, needs_redis, running_worker


def test_login_and_logout(client, on_call):
    response = client.post(reverse("login"), {"username": "olivia", "password": "olivia-password-1"})
    assert response.status_code == 302 and response.url == reverse("home")
    assert client.get(reverse("home")).url == reverse("journal:run_list")  # on-call lands on the runs
    assert client.get(reverse("journal:run_list")).status_code == 200
    assert client.get(reverse("logout")).status_code == 405  # logging out is a POST, so a link cannot do it
    assert client.post(reverse("logout")).status_code == 302
    assert client.get(reverse("journal:run_list")).status_code == 302


def test_the_person_an_agent_acts_for_lands_on_their_agents_and_sees_only_what_they_may_open(client, dana):
    client.force_login(dana)
    assert client.get(reverse("home")).url == reverse("journal:agent_list")
    page = client.get(reverse("journal:agent_list")).content.decode()
    assert "Your agents" in page
    for closed in ("journal:run_list", "approver:plan_list", "approver:action_list"):
        assert f'href="{reverse(closed)}"' not in page


def test_a_wrong_password_says_so(client, on_call):
    response = client.post(reverse("login"), {"username": "olivia", "password": "nope"})
    assert response.status_code == 200 and "do not match" in response.content.decode()


def test_login_needs_the_csrf_token(on_call):
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    assert (
        strict.post(reverse("login"), {"username": "olivia", "password": "olivia-password-1"}).status_code
        == 403
    )


def test_roles_exist_after_migrate(db):
    from django.contrib.auth.models import Group

    assert set(Group.objects.values_list("name", flat=True)) >= {"on-call", "approver", "admin"}


def test_health_reports_a_missing_worker(client, db):
    response = client.get(reverse("health"))
    body = response.json()
    assert body["database"] == "ok" and body["broker"] == "ok"
    if body["worker"] == "none running":
        assert response.status_code == 503 and body["status"] == "degraded"


def poll(ready, seconds: float = 30) -> None:
    """Wait until `ready()` is true, or give up after `seconds` and let the test's assertion say why."""
    deadline = time.monotonic() + seconds
    while not ready() and time.monotonic() < deadline:
        time.sleep(0.5)


@pytest.mark.django_db(transaction=True)
def test_health_sees_a_real_worker_process(client):
    # The worker inherits this process's environment, so it reads the same broker folder.
    with running_worker({**os.environ, "DJANGO_SETTINGS_MODULE": "approver.settings"}, "health-test"):
        poll(lambda: client.get(reverse("health")).json()["worker"] == "ok")
        body = client.get(reverse("health")).json()
    assert body == {"status": "ok", "database": "ok", "broker": "ok", "worker": "ok", "workers": 1}


@needs_redis
def test_health_command_sees_a_real_worker_on_redis():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "approver.settings", "REDIS_URL": REDIS_URL}

    def health():
        return subprocess.run(
            [sys.executable, "manage.py", "health"], env=env, capture_output=True, text=True
        )

    with running_worker(env, "redis-health-test"):
        poll(lambda: health().returncode == 0)
        result = health()
    assert result.returncode == 0, result.stdout + result.stderr
    assert '"broker": "ok", "worker": "ok"' in result.stdout


def test_every_page_sends_a_strict_content_security_policy(client, on_call):
    """Issue 22, finding 17: no page said where its script and style may come from."""
    client.force_login(on_call)
    for url in ("/login/", "/runs/", "/plans/"):
        policy = client.get(url)["Content-Security-Policy"]
        directives = dict(part.strip().split(" ", 1) for part in policy.split(";") if part.strip())
        assert directives["script-src"] == "'self'" and directives["style-src"] == "'self'", policy
        assert directives["frame-ancestors"] == "'none'" and "unsafe" not in policy
