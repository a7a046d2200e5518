"""Failed logins are throttled (issue 14, finding 11: 40 wrong passwords in 10 s, then the right one logged
in). django-axes locks an account, and an address, after LOGIN_FAILURE_LIMIT failures; the lock-out page says
so (HTTP 429), admins see it in the Django admin, and it clears by itself after LOGIN_LOCKOUT_MINUTES."""

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone

pytestmark = pytest.mark.django_db


def log_in(client, username, password, address="10.0.0.1"):
    return client.post(reverse("login"), {"username": username, "password": password}, REMOTE_ADDR=address)


def test_forty_wrong_passwords_then_the_right_one_does_not_log_in(client, on_call):
    answers = [log_in(client, "olivia", f"guess-{n}").status_code for n in range(40)]
    limit = settings.AXES_FAILURE_LIMIT
    assert answers[:limit - 1] == [200] * (limit - 1) and set(answers[limit:]) == {429}
    right = log_in(client, "olivia", "olivia-password-1")
    assert right.status_code == 429
    page = right.content.decode()
    assert "Too many failed logins" in page and "olivia" in page and "15 minutes" in page
    assert "_auth_user_id" not in client.session
    # From another address, the account is locked all the same.
    assert log_in(client, "olivia", "olivia-password-1", address="10.0.0.9").status_code == 429


def test_one_address_guessing_many_accounts_is_locked_out_not_the_accounts(client, on_call, approver_user):
    for n in range(settings.AXES_FAILURE_LIMIT):
        log_in(client, f"someone-{n}", "guess", address="10.6.6.6")
    assert log_in(client, "ana", "ana-password-1", address="10.6.6.6").status_code == 429
    assert log_in(client, "ana", "ana-password-1", address="10.0.0.2").status_code == 302


def test_the_lock_out_clears_by_itself(client, on_call):
    for n in range(settings.AXES_FAILURE_LIMIT):
        log_in(client, "olivia", f"guess-{n}")
    assert log_in(client, "olivia", "olivia-password-1").status_code == 429
    AccessAttempt.objects.update(
        attempt_time=timezone.now() - settings.AXES_COOLOFF_TIME - timedelta(seconds=1)
    )
    assert log_in(client, "olivia", "olivia-password-1").status_code == 302


def test_a_successful_login_clears_the_accounts_failures(client, on_call):
    for n in range(settings.AXES_FAILURE_LIMIT - 1):
        log_in(client, "olivia", f"guess-{n}")
    assert log_in(client, "olivia", "olivia-password-1").status_code == 302
    client.post(reverse("logout"))
    for n in range(settings.AXES_FAILURE_LIMIT - 1):
        assert log_in(client, "olivia", f"again-{n}").status_code == 200
    assert log_in(client, "olivia", "olivia-password-1").status_code == 302


def test_admins_see_lock_outs_and_can_clear_one(client, on_call):
    for n in range(settings.AXES_FAILURE_LIMIT):
        log_in(client, "olivia", f"guess-{n}", address="10.0.0.7")
    root = User.objects.create_superuser("root", password="root-password-1")
    admin = client.__class__()
    admin.force_login(root)
    listing = admin.get(reverse("admin:axes_accessattempt_changelist"))
    assert listing.status_code == 200
    page = listing.content.decode()
    assert "olivia" in page and "10.0.0.7" in page
    attempt = AccessAttempt.objects.get(username="olivia")
    assert attempt.failures_since_start == settings.AXES_FAILURE_LIMIT
    admin.post(reverse("admin:axes_accessattempt_delete", args=[attempt.pk]), {"post": "yes"})
    assert not AccessAttempt.objects.exists()
    assert log_in(client, "olivia", "olivia-password-1", address="10.0.0.7").status_code == 302


def test_the_django_admin_login_is_throttled_too(client, db):
    User.objects.create_superuser("root", password="root-password-1")
    for n in range(settings.AXES_FAILURE_LIMIT):
        client.post(
            reverse("admin:login"), {"username": "root", "password": f"guess-{n}"}, REMOTE_ADDR="10.0.0.3"
        )
    response = client.post(reverse("admin:login"), {"username": "root", "password": "root-password-1"},
                           REMOTE_ADDR="10.0.0.3")
    assert response.status_code == 429
