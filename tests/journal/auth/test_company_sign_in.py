"""Sign-in through the company's identity provider, against a real OpenID Connect provider (panva's certified
oidc-provider, started by the test) and this site served for real: discovery from the issuer, the code flow
with PKCE, an account made at the first sign-in, roles and teams from the provider's groups at every sign-in
and again while the person works, and what happens when the provider takes them away, stops vouching, or
does not answer. The browser journey is tests/browser/test_company_sign_in_journey.py."""

import re
from urllib.parse import urljoin

import httpx
import pytest
from django.contrib.auth.models import Group, User

from journal.auth import roles
from journal.models import ProviderIdentity, Team
from tests.conftest import free_port
from tests.identity import identity_provider
from tests.services import needs_oidc_provider

pytestmark = [needs_oidc_provider, pytest.mark.django_db(transaction=True)]

LENA = {"email": "lena@acme.example", "groups": ["undo-payments-approvers", "everyone-at-acme"]}


@pytest.fixture
def provider(recorder, tmp_path, settings):
    site = f"http://localhost:{recorder.port}"
    with identity_provider(tmp_path, port=free_port(), site=site, settings=settings) as running:
        running.site = site
        yield running


def sign_in(provider, login: str, *, next_page: str = "") -> tuple[httpx.Client, httpx.Response]:
    """Through the provider's own sign-in and consent pages, as a browser would: the client (its cookies the
    session) and the site's last answer."""
    browser = httpx.Client(timeout=30)
    answer = browser.get(f"{provider.site}/oidc/authenticate/" + (f"?next={next_page}" if next_page else ""))
    for form in ({"prompt": "login", "login": login, "password": "any"}, {"prompt": "consent"}):
        while answer.status_code in (302, 303) and not str(answer.url).startswith(provider.site + "/oidc/c"):
            answer = browser.get(urljoin(str(answer.url), answer.headers["location"]))
        if str(answer.url).startswith(provider.site):
            break
        answer = browser.post(re.search(r'action="([^"]+)"', answer.text).group(1), data=form)
    while answer.status_code in (302, 303):
        answer = browser.get(urljoin(str(answer.url), answer.headers["location"]))
    return browser, answer


def test_the_first_sign_in_makes_the_account_with_the_roles_and_teams_its_groups_give(provider):
    provider.people(lena=LENA)
    browser, landed = sign_in(provider, "lena", next_page="/plans/")
    assert landed.status_code == 200 and str(landed.url) == f"{provider.site}/plans/"
    lena = User.objects.get(username="lena")
    assert lena.email == "lena@acme.example" and not lena.has_usable_password()
    assert ProviderIdentity.objects.get(user=lena).subject == "lena"
    assert set(lena.groups.values_list("name", flat=True)) == {roles.APPROVER}
    assert list(Team.objects.filter(members=lena).values_list("name", flat=True)) == ["payments"]
    # Signed in again as the provider now says: an on-call engineer of payments, no longer an approver.
    provider.people(lena={**LENA, "groups": ["undo-payments-oncall"]})
    sign_in(provider, "lena")
    assert set(User.objects.get(pk=lena.pk).groups.values_list("name", flat=True)) == {roles.ON_CALL}
    assert User.objects.filter(username__startswith="lena").count() == 1  # found by `sub`, not made twice


def test_a_person_taken_out_of_a_group_loses_its_role_and_team_at_their_next_request(provider, settings):
    provider.people(lena=LENA)
    browser, _ = sign_in(provider, "lena")
    assert browser.get(f"{provider.site}/plans/").status_code == 200
    provider.people(lena={**LENA, "groups": ["everyone-at-acme"]})  # an admin took her out, at the provider
    refused = browser.get(f"{provider.site}/plans/")
    assert refused.status_code == 403 and "none of the roles" in refused.text
    lena = User.objects.get(username="lena")
    assert not lena.groups.exists() and not Team.objects.filter(members=lena).exists()
    # With reads checked once a minute, a write still asks the provider first.
    provider.people(lena=LENA)
    assert browser.get(f"{provider.site}/plans/").status_code == 200
    settings.OIDC_RECHECK_SECONDS = 60
    provider.people(lena={**LENA, "groups": []})
    assert browser.get(f"{provider.site}/plans/").status_code == 200  # read within the minute
    token_page = browser.get(f"{provider.site}/tokens/")
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', token_page.text).group(1)
    made = browser.post(f"{provider.site}/tokens/", headers={"Referer": f"{provider.site}/tokens/"},
                        data={"csrfmiddlewaretoken": csrf, "name": "x", "days": "7"})
    assert made.status_code == 403 and not User.objects.get(username="lena").api_tokens.exists()


def test_a_provider_that_stops_vouching_ends_the_session_and_one_that_is_down_refuses_writes(provider):
    provider.people(lena=LENA)
    browser, _ = sign_in(provider, "lena")
    provider.people()  # the account is gone at the provider: its userinfo answers no more
    ended = browser.get(f"{provider.site}/plans/")
    assert ended.status_code == 302 and ended.headers["location"].startswith("/login/")
    assert browser.get(f"{provider.site}/plans/").headers["location"].startswith("/login/")  # signed out
    provider.people(lena=LENA)
    browser, _ = sign_in(provider, "lena")
    page = browser.get(f"{provider.site}/tokens/")
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    provider.stop()
    assert browser.get(f"{provider.site}/plans/").status_code == 200  # reads go on with what it last said
    refused = browser.post(f"{provider.site}/tokens/", data={"csrfmiddlewaretoken": csrf, "name": "x",
                                                             "days": "7"})
    assert refused.status_code == 503 and "Acme SSO did not answer" in refused.text
    assert not User.objects.get(username="lena").api_tokens.exists()


def test_with_passwords_off_only_the_provider_signs_anyone_in(provider, settings, on_call):
    settings.PASSWORD_LOGIN = False
    settings.AUTHENTICATION_BACKENDS = [
        backend for backend in settings.AUTHENTICATION_BACKENDS if "ModelBackend" not in backend]
    browser = httpx.Client(timeout=30)
    page = browser.get(f"{provider.site}/login/")
    assert "Sign in with Acme SSO" in page.text and 'name="password"' not in page.text
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    token = csrf.group(1) if csrf else browser.cookies.get("csrftoken")
    refused = browser.post(f"{provider.site}/login/", data={
        "csrfmiddlewaretoken": token, "username": "olivia", "password": "olivia-password-1"})
    assert refused.status_code == 400 and "Passwords are switched off here" in refused.text
    assert browser.get(f"{provider.site}/runs/").status_code == 302  # not signed in
    provider.people(lena=LENA)
    _, landed = sign_in(provider, "lena")
    assert landed.status_code == 200


def test_an_issuer_that_is_not_the_one_configured_is_not_trusted_and_the_page_says_so(provider, settings):
    settings.OIDC_ISSUER = provider.issuer.replace("localhost", "127.0.0.1")  # discovery names another
    browser = httpx.Client(timeout=30, follow_redirects=True)
    page = browser.get(f"{provider.site}/oidc/authenticate/")
    assert str(page.url).startswith(f"{provider.site}/login/")
    assert "names another issuer" in page.text.replace("&#x27;", "'") and not User.objects.filter(
        username="lena").exists()


def test_a_callback_nobody_started_signs_nobody_in(provider):
    browser = httpx.Client(timeout=30, follow_redirects=True)
    page = browser.get(f"{provider.site}/oidc/callback/", params={"code": "made-up", "state": "made-up"})
    assert str(page.url).startswith(f"{provider.site}/login/") and "did not work" in page.text
    assert browser.get(f"{provider.site}/runs/", follow_redirects=False).status_code == 302


def test_without_a_mapping_signing_in_leaves_roles_and_teams_to_the_admins(provider, settings):
    settings.OIDC_GROUPS = {}  # Google Workspace, say: no groups in its answer
    provider.people(lena=LENA)
    sign_in(provider, "lena")
    lena = User.objects.get(username="lena")
    assert not lena.groups.exists()
    lena.groups.add(Group.objects.get_or_create(name=roles.APPROVER)[0])  # an admin gives her a role
    browser, _ = sign_in(provider, "lena")
    assert browser.get(f"{provider.site}/plans/").status_code == 200
    assert set(User.objects.get(pk=lena.pk).groups.values_list("name", flat=True)) == {roles.APPROVER}
