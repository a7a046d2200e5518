"""Failed logins are throttled (issue 14, finding 11: 40 wrong passwords in 10 s, then the right one logged
in). django-axes locks an account from one address after LOGIN_FAILURE_LIMIT failures, an account from
anywhere after LOGIN_ACCOUNT_FAILURE_LIMIT, and an address after LOGIN_ADDRESS_FAILURE_LIMIT on any
accounts (issue 22, finding 8: five wrong passwords from anywhere locked an approver out); the lock-out page
says so (HTTP 429), admins see it in the Django admin, and it clears by itself after
LOGIN_LOCKOUT_MINUTES."""

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone

from approver.lockouts import weighted

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


def test_each_count_locks_at_its_own_limit():
    limits = [5, 25, 25]
    assert weighted([4, 24, 24], limits) == 4  # under every limit
    assert weighted([5, 5, 5], limits) == 5  # one account from one address
    assert weighted([0, 25, 0], limits) == 5 and weighted([0, 0, 25], limits) == 5


def test_someone_elses_wrong_passwords_do_not_lock_an_approver_out(client, approver_user):
    for n in range(settings.AXES_FAILURE_LIMIT):
        log_in(client, "ana", f"guess-{n}", address="10.6.6.6")
    assert log_in(client, "ana", "ana-password-1", address="10.6.6.6").status_code == 429
    assert log_in(client, "ana", "ana-password-1", address="10.0.0.2").status_code == 302


def test_guessing_one_account_from_many_addresses_locks_it_at_the_slower_limit(client, approver_user):
    for n in range(settings.LOGIN_ACCOUNT_FAILURE_LIMIT - 2):
        log_in(client, "ana", "guess", address=f"10.7.{n // 4}.{n % 4}")  # under each address's own limit
    assert log_in(client, "ana", "guess", address="10.7.99.1").status_code == 200  # not locked yet
    assert log_in(client, "ana", "guess", address="10.7.99.2").status_code == 429  # the limit reached
    assert log_in(client, "ana", "ana-password-1", address="10.0.0.2").status_code == 429


def test_one_address_guessing_many_accounts_is_locked_out_not_the_accounts(client, on_call, approver_user):
    for n in range(settings.LOGIN_ADDRESS_FAILURE_LIMIT):
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
