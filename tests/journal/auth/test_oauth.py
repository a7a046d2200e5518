"""MCP authorization for clients that take only a URL: metadata, registration, consent with an agent picker,
PKCE, audience, refresh, and revocation, through the real endpoints and the real Recorder.

The browser journey (the `mcp` SDK's OAuth client and Chromium, from a bare URL) is in
tests/browser/test_oauth_journey.py.
"""

import base64
import hashlib
import json
import re
import secrets
from datetime import timedelta
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest
from django.test import Client
from django.utils import timezone
from oauth2_provider.models import AccessToken, Application, Grant, RefreshToken

from journal import services
from journal.models import Agent, ClientAuthorization, RedeemedCode, Step
from journal.services import clients
from journal.tasks import forget_unused_oauth_clients
from tests.journal.helpers import register_samples, run_agent

pytestmark = pytest.mark.django_db(transaction=True)

REDIRECT = "http://127.0.0.1:53682/callback"


def pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    return verifier, challenge


class Flow:
    """One client's authorization code flow against this app, as a browser and an MCP client would run it,
    on the host the client was given (the Recorder's URL is the token's audience)."""

    def __init__(self, host: str = "testserver", auth_method: str = "none"):
        self.host = host
        self.http = Client(HTTP_HOST=host, enforce_csrf_checks=True)  # as browsers and clients meet it
        registered = self.http.post(
            "/oauth/register/",
            content_type="application/json",
            data={
                "redirect_uris": [REDIRECT],
                "client_name": "Desk Assistant",
                "grant_types": ["authorization_code", "refresh_token"],
                "response_types": ["code"],
                "token_endpoint_auth_method": auth_method,
            },
        )
        assert registered.status_code == 201, registered.content
        self.client_info = registered.json()
        self.client_id = self.client_info["client_id"]
        self.verifier, self.challenge = pkce()
        self.recorder = f"http://{host}/mcp"

    def authorize_url(self, **overrides) -> str:
        params = {
            "response_type": "code",
            "client_id": self.client_id,
            "redirect_uri": REDIRECT,
            "state": "s-1",
            "code_challenge": self.challenge,
            "code_challenge_method": "S256",
            "scope": "mcp",
            "resource": self.recorder,
            **overrides,
        }
        return "/oauth/authorize/?" + urlencode({k: v for k, v in params.items() if v is not None})

    def consent(
        self, person, *, agent: str | None = None, new_agent: str = "", allow: bool = True, **overrides
    ):
        """Sign in as `person`, open the consent page and answer it; the response the client's browser
        gets."""
        self.http.force_login(person)
        page = self.http.get(self.authorize_url(**overrides))
        if page.status_code != 200:
            return page
        form = page.context["form"]
        data = {name: form[name].value() or "" for name in form.fields if form.fields[name].widget.is_hidden}
        data.update(
            agent=agent or "__new__",
            new_agent_name=new_agent,
            csrfmiddlewaretoken=str(page.context["csrf_token"]),
        )
        if allow:
            data["allow"] = "on"
        return self.http.post(self.authorize_url(**overrides), data)

    @staticmethod
    def code_from(response) -> str:
        assert response.status_code == 302, response.content[:500]
        query = parse_qs(urlsplit(response.url).query)
        assert query.get("state") == ["s-1"], query
        return query["code"][0]

    def token(self, **data) -> httpx.Response:
        response = self.http.post("/oauth/token/", {"client_id": self.client_id, **data})
        return response

    def exchange(self, code: str, **overrides):
        return self.token(**{"grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT,
                             "code_verifier": self.verifier, "resource": self.recorder, **overrides})

    def tokens_for(self, person, **consent) -> dict:
        response = self.exchange(self.code_from(self.consent(person, **consent)))
        assert response.status_code == 200, response.content
        return response.json()


def test_the_recorder_and_this_app_publish_their_metadata(client):
    resource = client.get("/.well-known/oauth-protected-resource/mcp").json()
    assert resource["resource"] == "http://testserver/mcp"
    assert resource["authorization_servers"] == ["http://testserver"]
    assert resource["scopes_supported"] == ["mcp"] and resource["bearer_methods_supported"] == ["header"]
    assert client.get("/.well-known/oauth-protected-resource").json()["resource"] == "http://testserver/mcp"

    server = client.get("/.well-known/oauth-authorization-server").json()
    assert server["issuer"] == "http://testserver"
    assert server["authorization_endpoint"] == "http://testserver/oauth/authorize/"
    assert server["token_endpoint"] == "http://testserver/oauth/token/"
    assert server["registration_endpoint"] == "http://testserver/oauth/register/"
    assert server["code_challenge_methods_supported"] == ["S256"]
    assert server["grant_types_supported"] == ["authorization_code", "refresh_token"]
    assert server["response_types_supported"] == ["code"]


def test_the_recorder_names_its_metadata_in_its_401(recorder):
    bare = httpx.post(f"{recorder.base}/mcp/", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert bare.status_code == 401
    challenge = bare.headers["www-authenticate"]
    metadata = f"{recorder.base}/.well-known/oauth-protected-resource/mcp"
    assert challenge.startswith("Bearer ") and f'resource_metadata="{metadata}"' in challenge
    assert 'error="invalid_token"' not in challenge  # no token was sent, so no error code (RFC 6750 §3.1)
    assert httpx.get(metadata).json()["resource"] == f"{recorder.base}/mcp"

    wrong = httpx.post(f"{recorder.base}/mcp/", json={}, headers={"Authorization": "Bearer not-a-token"})
    assert wrong.status_code == 401 and 'error="invalid_token"' in wrong.headers["www-authenticate"]
    assert wrong.json()["error_description"].startswith("The token is not known here")


def test_registration_refuses_malformed_metadata_clearly():
    http = Client()
    for body, problem in [
        ("not json", "must be valid JSON"),
        ({"redirect_uris": "http://x/cb"}, "redirect_uris must be an array"),
        ({"redirect_uris": ["http://attacker.example/cb"]}, "loopback"),
        ({"redirect_uris": ["https://x/cb"], "grant_types": ["password"]}, "grant_type"),
        ({"redirect_uris": ["https://x/cb"], "response_types": ["token"]}, "only 'code'"),
        ({"redirect_uris": [f"https://x/{i}" for i in range(11)]}, "at most 10"),
        ({"redirect_uris": ["https://x/cb"], "client_name": "Evil\r\nBcc: x"}, "control characters"),
        ({"redirect_uris": ["https://x/cb"], "token_endpoint_auth_method": "private_key_jwt"}, "Unsupported"),
    ]:
        response = http.post("/oauth/register/", body if isinstance(body, str) else json.dumps(body),
                             content_type="application/json")
        assert response.status_code == 400, body
        assert (
            response.json()["error"] == "invalid_client_metadata"
            and problem in response.json()["error_description"]
        )
    assert not Application.objects.exists()


@pytest.mark.parametrize("uri", ["https://trusted.example@evil.example/cb", "https://user:pw@x.example/cb",
                                 "https://trusted.example\\@evil.example/cb", "http://127.0.0.1\\evil.example/cb"])
def test_registration_refuses_redirect_uris_with_userinfo_or_backslashes(uri):
    """Issue 22: a redirect URI that reads as one host and goes to another is refused when it registers."""
    response = Client().post("/oauth/register/", json.dumps({"redirect_uris": [uri]}),
                             content_type="application/json")
    assert response.status_code == 400 and "no user name or password" in response.json()["error_description"]
    assert not Application.objects.exists()


def test_consent_picks_or_creates_the_agent_and_the_token_acts_as_it(dana):
    services.create_agent(name="dana-desk", on_behalf_of=dana)
    flow = Flow()
    flow.http.force_login(dana)
    page = flow.http.get(flow.authorize_url())
    body = page.content.decode()
    assert page.status_code == 200 and "Desk Assistant" in body and "http://testserver/mcp" in body
    assert "dana-desk" in body and "A new agent" in body

    tokens = flow.tokens_for(dana, new_agent="dana-assistant")
    agent = Agent.objects.get(name="dana-assistant")
    assert agent.on_behalf_of == dana and agent.is_active
    assert tokens["token_type"] == "Bearer" and tokens["scope"] == "mcp" and tokens["refresh_token"]
    verdict = clients.agent_for_token(tokens["access_token"], audience="http://testserver/mcp")
    assert verdict.agent == agent
    access = AccessToken.objects.get(scope="mcp")
    assert access.resource == ["http://testserver/mcp"] and access.token == ""  # hashed at rest (RFC 9700)

    # Picking the existing agent instead ends the tokens the client held as the other one.
    second = flow.tokens_for(dana, agent="dana-desk")
    assert (
        clients.agent_for_token(second["access_token"], audience="http://testserver/mcp").agent.name
        == "dana-desk"
    )
    refused = clients.agent_for_token(tokens["access_token"], audience="http://testserver/mcp")
    assert refused.agent is None and "not known" in refused.problem
    assert ClientAuthorization.objects.get().agent.name == "dana-desk"


def test_consent_offers_only_the_persons_own_agents(dana, on_call):
    services.create_agent(name="dana-desk", on_behalf_of=dana)
    flow = Flow()
    flow.http.force_login(on_call)
    assert "dana-desk" not in flow.http.get(flow.authorize_url()).content.decode()
    refused = flow.consent(on_call, agent="dana-desk")
    assert refused.status_code == 200 and "Select a valid choice" in refused.content.decode()
    taken = flow.consent(on_call, new_agent="dana-desk")
    assert taken.status_code == 200 and "exists already" in taken.content.decode()
    unnamed = flow.consent(on_call, new_agent="")
    assert unnamed.status_code == 200 and "Name the new agent" in unnamed.content.decode()
    assert not ClientAuthorization.objects.exists() and not AccessToken.objects.filter(scope="mcp").exists()


def test_denying_tells_the_client_and_authorises_nothing(dana):
    flow = Flow()
    response = flow.consent(dana, new_agent="never", allow=False)
    assert response.status_code == 302 and parse_qs(urlsplit(response.url).query)["error"] == [
        "access_denied"
    ]
    assert not Agent.objects.filter(name="never").exists() and not ClientAuthorization.objects.exists()


def test_pkce_is_required_and_only_s256_is_accepted(dana):
    flow = Flow()
    flow.http.force_login(dana)
    missing = flow.http.get(flow.authorize_url(code_challenge=None, code_challenge_method=None))
    assert missing.status_code == 302 and "code+challenge+required" in missing.url.replace("%20", "+").lower()

    plain = flow.consent(dana, new_agent="a1", code_challenge="x" * 43, code_challenge_method="plain")
    assert plain.status_code == 302 and "error=invalid_request" in plain.url and "S256" in plain.url

    code = flow.code_from(flow.consent(dana, new_agent="a2"))
    wrong = flow.exchange(code, code_verifier=secrets.token_urlsafe(48))
    assert wrong.status_code == 400 and wrong.json()["error"] == "invalid_grant"
    assert not AccessToken.objects.filter(scope="mcp").exists()


def test_tokens_are_only_for_this_recorder(dana):
    flow = Flow()
    other = flow.consent(dana, new_agent="a1", resource="https://elsewhere.example/mcp")
    assert other.status_code == 302
    assert parse_qs(urlsplit(other.url).query)["error"] == ["invalid_target"]
    assert not ClientAuthorization.objects.exists()

    # Asking for no resource still binds the token to this Recorder.
    code = flow.code_from(flow.consent(dana, new_agent="a2", resource=None))
    escalated = flow.exchange(code, resource="https://elsewhere.example/mcp")
    # (the toolkit answers this one as text/html, with a JSON body)
    assert escalated.status_code == 400 and json.loads(escalated.content)["error"] == "invalid_target"
    tokens = flow.tokens_for(dana, agent="a2", resource=None)
    assert AccessToken.objects.get(scope="mcp").resource == ["http://testserver/mcp"]
    elsewhere = clients.agent_for_token(tokens["access_token"], audience="http://localhost:8000/mcp")
    assert elsewhere.agent is None and "issued for another resource" in elsewhere.problem
    # The same Recorder with a trailing slash is the same audience.
    assert (
        clients.agent_for_token(tokens["access_token"], audience="HTTP://TESTSERVER/mcp/").agent.name == "a2"
    )


def test_refresh_rotates_and_a_replayed_refresh_token_ends_the_family(dana):
    flow = Flow()
    first = flow.tokens_for(dana, new_agent="a1")
    renewed = flow.token(grant_type="refresh_token", refresh_token=first["refresh_token"])
    assert renewed.status_code == 200, renewed.content
    second = renewed.json()
    assert (
        second["access_token"] != first["access_token"] and second["refresh_token"] != first["refresh_token"]
    )
    audience = "http://testserver/mcp"
    assert clients.agent_for_token(second["access_token"], audience=audience).agent.name == "a1"
    assert clients.agent_for_token(first["access_token"], audience=audience).agent is None

    replay = flow.token(grant_type="refresh_token", refresh_token=first["refresh_token"])
    assert replay.status_code == 400 and replay.json()["error"] == "invalid_grant"
    # Reuse of a rotated refresh token means it leaked: its whole family ends (RFC 9700 §4.14.2).
    assert flow.token(grant_type="refresh_token", refresh_token=second["refresh_token"]).status_code == 400


def test_a_replayed_authorization_code_ends_every_token_it_gave(dana):
    """Issue 22, finding 10: a code exchanged twice has leaked (RFC 6749 section 4.1.2), so the tokens it
    gave, and the refresh tokens rotated from them, end; the replay itself gets nothing."""
    flow = Flow()
    code = flow.code_from(flow.consent(dana, new_agent="a1"))
    first = flow.exchange(code).json()
    rotated = flow.token(grant_type="refresh_token", refresh_token=first["refresh_token"]).json()
    audience = "http://testserver/mcp"
    assert clients.agent_for_token(rotated["access_token"], audience=audience).agent.name == "a1"

    replay = flow.exchange(code)
    assert replay.status_code == 400 and replay.json()["error"] == "invalid_grant"
    assert clients.agent_for_token(first["access_token"], audience=audience).agent is None
    assert clients.agent_for_token(rotated["access_token"], audience=audience).agent is None
    again = flow.token(grant_type="refresh_token", refresh_token=rotated["refresh_token"])
    assert again.status_code == 400 and again.json()["error"] == "invalid_grant"
    # Another code of the same client, never replayed, is untouched.
    other = flow.tokens_for(dana, agent="a1")
    assert clients.agent_for_token(other["access_token"], audience=audience).agent.name == "a1"


def test_a_confidential_client_authenticates_at_the_token_endpoint(dana):
    flow = Flow(auth_method="client_secret_post")
    secret = flow.client_info["client_secret"]
    code = flow.code_from(flow.consent(dana, new_agent="a1"))
    assert flow.exchange(code, client_secret="wrong").status_code == 401
    code = flow.code_from(flow.consent(dana, agent="a1"))
    assert flow.exchange(code, client_secret=secret).status_code == 200


def test_the_recorder_journals_an_oauth_clients_calls_under_its_agent_and_revoking_stops_it_at_once(
        recorder, sample_servers, dana, admin_user, outsider):
    register_samples(sample_servers, names=("crm",))
    flow = Flow(host=f"127.0.0.1:{recorder.port}")
    tokens = flow.tokens_for(dana, new_agent="dana-assistant")

    async def read_deal(client):
        return await client.call_tool("crm__get_deal", {"deal_id": "D-881"})

    result = run_agent(recorder, tokens["access_token"], read_deal)
    assert not result.is_error
    step = Step.objects.select_related("run__agent").get()
    assert step.run.agent.name == "dana-assistant" and step.tool == "get_deal"

    # Another host's name for the same machine is another audience: refused.
    misaddressed = httpx.post(f"http://localhost:{recorder.port}/mcp/", json={},
                              headers={"Authorization": f"Bearer {tokens['access_token']}"})
    assert misaddressed.status_code == 401 and "another resource" in misaddressed.json()["error_description"]

    # The agent's page lists the client; someone else may not revoke it, the person may.
    authorization = ClientAuthorization.objects.get()
    page = Client()
    page.force_login(dana)
    detail = page.get("/agents/dana-assistant/").content.decode()
    assert "Desk Assistant" in detail and "Revoke" in detail
    revoke_url = f"/agents/dana-assistant/clients/{authorization.pk}/revoke/"
    forged = Client(enforce_csrf_checks=True)
    forged.force_login(dana)
    assert forged.post(revoke_url).status_code == 403  # no CSRF token: a forged form cannot revoke
    page.force_login(outsider)
    assert page.post(revoke_url).status_code == 404  # to them there is no such agent
    page.force_login(dana)
    assert page.post(revoke_url).status_code == 302

    refused = httpx.post(f"{recorder.base}/mcp/", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                         headers={"Authorization": f"Bearer {tokens['access_token']}"})
    assert refused.status_code == 401
    assert not AccessToken.objects.filter(scope="mcp").exists()
    assert not RefreshToken.objects.filter(revoked__isnull=True).exists()
    assert flow.token(grant_type="refresh_token", refresh_token=tokens["refresh_token"]).status_code == 400


def test_the_consent_page_names_where_the_code_goes_and_that_the_client_is_unverified_and_is_never_skipped(
        dana):
    """Issue 22, finding 6: the page showed only the client's chosen name ("Claude Desktop (official)"), and
    `approval_prompt=auto` skipped it altogether for a client authorised once before."""
    flow = Flow()
    flow.tokens_for(dana, new_agent="a1")
    flow.http.force_login(dana)
    page = flow.http.get(flow.authorize_url(approval_prompt="auto"))
    assert page.status_code == 200  # the page, not a redirect with a code
    shown = page.content.decode()
    assert "Unverified client" in shown and "registered itself" in shown
    assert "sends the code to <strong><code>127.0.0.1:53682</code></strong>" in shown


def test_a_consent_the_toolkit_refuses_creates_no_agent_and_authorises_nothing(dana):
    """Issue 22, finding 11: the agent was created and the client authorised before the request was
    validated, so a tampered form (here, a redirect URI the client never registered) left both behind."""
    flow = Flow()
    flow.http.force_login(dana)
    page = flow.http.get(flow.authorize_url())
    form = page.context["form"]
    data = {name: form[name].value() or "" for name in form.fields if form.fields[name].widget.is_hidden}
    data.update(agent="__new__", new_agent_name="fresh", allow="on", redirect_uri="https://evil.example/cb",
                csrfmiddlewaretoken=str(page.context["csrf_token"]))
    answer = flow.http.post(flow.authorize_url(), data)
    assert "evil.example" not in answer.get("Location", "")
    assert not Agent.objects.filter(name="fresh").exists() and not ClientAuthorization.objects.exists()
    assert not Grant.objects.exists()


def test_a_deactivated_agent_or_person_ends_the_clients_tokens(dana):
    flow = Flow()
    tokens = flow.tokens_for(dana, new_agent="a1")
    audience = "http://testserver/mcp"
    Agent.objects.filter(name="a1").update(is_active=False)
    assert "deactivated" in clients.agent_for_token(tokens["access_token"], audience=audience).problem
    Agent.objects.filter(name="a1").update(is_active=True)
    # A bulk update saves no row (so the tokens are not ended at once): the check on every request stops them.
    type(dana).objects.filter(pk=dana.pk).update(is_active=False)
    assert "no longer active" in clients.agent_for_token(tokens["access_token"], audience=audience).problem


@pytest.mark.parametrize("who", ["agent", "person"])
def test_deactivating_ends_the_clients_tokens_for_good_refresh_included(dana, who):
    """Issue 22, finding 9: deactivating only suspended a client's tokens: its refresh still answered 200,
    and every token worked again once the person or agent was active again."""
    flow = Flow()
    tokens = flow.tokens_for(dana, new_agent="a1")
    subject = Agent.objects.get(name="a1") if who == "agent" else dana
    subject.is_active = False
    subject.save()
    refreshed = flow.token(grant_type="refresh_token", refresh_token=tokens["refresh_token"])
    assert refreshed.status_code == 400 and refreshed.json()["error"] == "invalid_grant"
    subject.is_active = True
    subject.save()
    verdict = clients.agent_for_token(tokens["access_token"], audience="http://testserver/mcp")
    assert verdict.agent is None
    assert flow.token(grant_type="refresh_token", refresh_token=tokens["refresh_token"]).status_code == 400


def test_an_expired_token_is_refused_with_a_hint_to_refresh(dana):
    flow = Flow()
    tokens = flow.tokens_for(dana, new_agent="a1")
    AccessToken.objects.filter(scope="mcp").update(expires=timezone.now() - timedelta(seconds=1))
    verdict = clients.agent_for_token(tokens["access_token"], audience="http://testserver/mcp")
    assert verdict.agent is None and "expired" in verdict.problem


def test_registrations_nobody_authorised_are_forgotten_after_a_day(dana):
    used, unused = Flow(), Flow()
    used.tokens_for(dana, new_agent="a1")
    later = timezone.now() + timedelta(days=1, minutes=1)
    assert clients.forget_unused_clients(older_than=timezone.now() - timedelta(days=1)) == 0
    assert clients.forget_unused_clients(older_than=later) == 1
    assert Application.objects.filter(client_id=used.client_id).exists()
    assert not Application.objects.filter(client_id=unused.client_id).exists()


def test_agent_pages_show_each_person_their_own_agents(dana, outsider, on_call):
    services.create_agent(name="dana-desk", on_behalf_of=dana)
    page = Client()
    page.force_login(outsider)
    assert "dana-desk" not in page.get("/agents/").content.decode()
    # An agent they may not see reads exactly as one that does not exist (issue 22, "also").
    hidden, missing = page.get("/agents/dana-desk/"), page.get("/agents/no-such-bot/")
    assert hidden.status_code == missing.status_code == 404
    unmasked = [re.sub(rb"[A-Za-z0-9]{64}", b"CSRF", page.content) for page in (hidden, missing)]
    assert unmasked[0] == unmasked[1] and b"No such agent among those you may see." in hidden.content
    page.force_login(dana)
    assert "dana-desk" in page.get("/agents/").content.decode()
    page.force_login(on_call)
    assert page.get("/agents/dana-desk/").status_code == 200


def test_the_beat_task_forgets_unused_registrations_and_codes_whose_tokens_are_dead(dana):
    unused, fresh, used = Flow(), Flow(), Flow()
    used.tokens_for(dana, new_agent="a1")
    used.tokens_for(dana, agent="a1")
    Application.objects.filter(client_id=unused.client_id).update(created=timezone.now() - timedelta(days=2))
    RedeemedCode.objects.filter(pk=RedeemedCode.objects.earliest("pk").pk).update(
        redeemed_at=timezone.now() - timedelta(days=31))
    assert forget_unused_oauth_clients() == 1
    assert set(Application.objects.values_list("client_id", flat=True)) == {fresh.client_id, used.client_id}
    assert RedeemedCode.objects.count() == 1


# Issue 22, finding 2: an anonymous CPU flood through OAuth. Each registration hashed a generated secret with
# PBKDF2 (a third of a second of CPU, public clients included), a wrong secret cost as much, neither endpoint
# was limited, and registrations nobody authorised piled up for a day.

def register(address: str = "127.0.0.1", auth_method: str = "none"):
    return Client(REMOTE_ADDR=address).post("/oauth/register/", content_type="application/json", data={
        "redirect_uris": [REDIRECT], "client_name": "Desk Assistant",
        "token_endpoint_auth_method": auth_method})


def test_registration_is_limited_per_address_and_says_when_to_come_back(settings):
    settings.OAUTH_REGISTRATIONS_PER_HOUR = 3
    assert [register("203.0.113.7").status_code for _ in range(3)] == [201, 201, 201]
    refused = register("203.0.113.7")
    assert refused.status_code == 429 and refused.json()["error"] == "too_many_requests"
    assert "At most 3 of these an hour" in refused.json()["error_description"]
    assert 0 < int(refused["Retry-After"]) <= 3600
    assert Application.objects.count() == 3
    assert register("198.51.100.9").status_code == 201  # another address is counted on its own


def test_the_token_endpoint_is_limited_per_address(settings, dana):
    settings.OAUTH_TOKEN_REQUESTS_PER_MINUTE = 4
    flow = Flow(auth_method="client_secret_post")
    wrong = {"client_id": flow.client_id, "client_secret": "wrong", "grant_type": "authorization_code",
             "code": "x", "redirect_uri": REDIRECT, "code_verifier": flow.verifier}
    attacker = Client(REMOTE_ADDR="203.0.113.7")
    assert [attacker.post("/oauth/token/", wrong).status_code for _ in range(4)] == [401] * 4
    refused = attacker.post("/oauth/token/", wrong)
    assert refused.status_code == 429 and int(refused["Retry-After"]) <= 60
    # The client itself, elsewhere, still gets its tokens.
    code = flow.code_from(flow.consent(dana, new_agent="a1"))
    assert flow.exchange(code, client_secret=flow.client_info["client_secret"]).status_code == 200


def test_a_public_client_is_kept_with_no_secret_and_a_confidential_ones_without_a_password_hash(dana):
    public = register(auth_method="none")
    assert public.status_code == 201 and "client_secret" not in public.json()
    kept = Application.objects.get(client_id=public.json()["client_id"])
    assert kept.client_secret == "" and not kept.hash_client_secret
    confidential = register(auth_method="client_secret_basic").json()
    stored = Application.objects.get(client_id=confidential["client_id"]).client_secret
    # Salted SHA-256 of the generated 128-character secret (journal.auth.hashers), never PBKDF2.
    assert stored.startswith("sha256-client-secret$") and confidential["client_secret"] not in stored
    # And the public client still signs in (PKCE is its proof).
    Flow().tokens_for(dana, new_agent="a1")


def test_registrations_nobody_authorised_are_kept_to_a_number_the_oldest_forgotten_first(settings, dana):
    settings.OAUTH_MAX_PENDING_CLIENTS = 2
    used = Flow()
    used.tokens_for(dana, new_agent="a1")
    ids = [register(f"198.51.100.{n}").json()["client_id"] for n in range(4)]
    assert set(Application.objects.values_list("client_id", flat=True)) == {used.client_id, *ids[-2:]}


def test_an_agent_minted_on_the_consent_page_by_an_account_with_no_role_asks_no_approver(dana, on_call):
    """Issue 43, finding 7: anyone who can sign in could mint an agent and have every approver emailed for
    each call it made up. Made by an account with no role, it starts unable to ask approvers (its calls a
    policy would hold are refused) until an admin lets it; made by someone with a role, it asks as usual."""
    Flow().tokens_for(dana, new_agent="dana-signup")
    Flow().tokens_for(on_call, new_agent="olivia-tool")
    assert Agent.objects.get(name="dana-signup").asks_approvers is False
    assert Agent.objects.get(name="olivia-tool").asks_approvers is True


def test_the_person_an_agent_acts_for_is_not_offered_links_to_runs_she_cannot_open(dana, on_call):
    """Issue 44, finding 10: dana saw links to her agent's runs that all answered "Not allowed"."""
    from tests.journal.factories import make_run

    agent, _ = services.create_agent(name="dana-desk", on_behalf_of=dana)
    run = make_run(agent, steps=1)
    page = Client()
    page.force_login(dana)
    mine = page.get("/agents/dana-desk/").content.decode()
    assert f"/runs/{run.public_id}/" not in mine and 'id="runs-not-yours"' in mine
    assert page.get(f"/runs/{run.public_id}/").status_code == 403  # as before: not hers to read
    page.force_login(on_call)
    theirs = page.get("/agents/dana-desk/").content.decode()
    assert f"/runs/{run.public_id}/" in theirs and 'id="runs-not-yours"' not in theirs
