"""Walk every URL of the app with every persona: each is refused unless the persona's role allows it.

The table names the roles each page allows. A new URL without an entry here fails the first test, so no
page can be added without deciding who may use it.
"""

import pytest
from django.contrib.auth.models import Group, User
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from oauth2_provider.models import Application

from approver import policy, services
from approver.models import AutonomyPolicy
from journal import services as journal_services
from journal.auth import roles
from journal.models import ClientAuthorization, Team
from tests.journal.factories import crm_server, make_run

from .softkey import SoftKey

pytestmark = pytest.mark.django_db(transaction=True)

READERS = {roles.ON_CALL, roles.APPROVER, roles.ADMIN}
SIGNED_IN = "anyone signed in"  # whoever is signed in, with or without a role
OWNER = "the agent's person"  # dana, whom the fixture's agent acts for
# Pages of one agent: to whoever may not see the agent, there is no such agent (404, as for a name that
# does not exist); whoever may see it but not act is refused (403).
AGENT_PAGES = {"journal:agent_detail", "journal:agent_client_revoke"}
# name -> (method, roles allowed)
ACCESS = {
    "journal:run_list": ("get", READERS),
    "journal:run_detail": ("get", READERS),
    "journal:run_verify": ("get", READERS),
    "journal:run_end": ("post", {roles.ON_CALL, roles.ADMIN}),
    "journal:run_release": ("post", {roles.ON_CALL, roles.ADMIN}),
    "journal:agent_list": ("get", READERS | {SIGNED_IN}),
    "journal:agent_detail": ("get", READERS | {OWNER}),
    "journal:agent_client_revoke": ("post", {roles.ADMIN, OWNER}),
    "approver:request_undo": ("post", {roles.ON_CALL}),
    "approver:undo_since": ("post", {roles.ON_CALL}),
    "approver:plan_list": ("get", READERS),
    "approver:plan_detail": ("get", READERS),
    "approver:check_again": ("post", {roles.ON_CALL, roles.APPROVER}),
    "approver:cancel": ("post", {roles.ON_CALL, roles.ADMIN}),
    "approver:abort": ("post", {roles.APPROVER, roles.ADMIN}),
    "approver:pause": ("post", {roles.APPROVER, roles.ADMIN}),
    "approver:resume": ("post", {roles.APPROVER, roles.ADMIN}),
    "approver:plan_rest": ("post", {roles.ON_CALL, roles.APPROVER}),
    "approver:break_lease": ("post", {roles.ADMIN}),
    "approver:check_outcome": ("post", READERS),
    "approver:settle_outcome": ("post", READERS),
    "approver:retry_outcome": ("post", {roles.APPROVER, roles.ADMIN}),
    "approver:passkey_list": ("get", {roles.APPROVER}),
    "approver:passkey_options": ("post", {roles.APPROVER}),
    "approver:passkey_enroll": ("post", {roles.APPROVER}),
    "approver:passkey_revoke": ("post", {roles.APPROVER}),
    "approver:token_list": ("get", READERS),
    "approver:token_revoke": ("post", READERS),
    "approver:sign_begin": ("post", {roles.APPROVER}),
    "approver:sign_complete": ("post", {roles.APPROVER}),
    "approver:policy_list": ("get", {roles.ADMIN}),
    "approver:policy_new": ("get", {roles.ADMIN}),
    "approver:policy_edit": ("get", {roles.ADMIN}),
    "approver:policy_delete": ("post", {roles.ADMIN}),
    "approver:server_list": ("get", {roles.ADMIN}),
    "approver:server_detail": ("get", {roles.ADMIN}),
    "approver:server_pack": ("post", {roles.ADMIN}),
    "approver:server_recipe": ("post", {roles.ADMIN}),
    "approver:server_recipe_remove": ("post", {roles.ADMIN}),
    "approver:action_list": ("get", READERS),
    "approver:action_detail": ("get", READERS),
    "approver:action_sign_begin": ("post", READERS),  # the held call's policy names the group that decides
    "approver:action_sign_complete": ("post", READERS),
    # The API (`approver.web_api`): a session or a personal token; anonymous callers get a 401, not a login
    # page.
    "api:run_list": ("get", READERS),
    "api:run_detail": ("get", READERS),
    "api:step_list": ("get", READERS),
    "api:step_result": ("get", READERS),
    "api:openapi-json": ("get", READERS),
    "api:plan_list": ("get", READERS),
    "api:plan_detail": ("get", READERS),
    "api:ask_from_run": ("post", {roles.ON_CALL}),
    "api:ask_since": ("post", {roles.ON_CALL}),
    "api:pause": ("post", {roles.APPROVER, roles.ADMIN}),
    "api:resume": ("post", {roles.APPROVER, roles.ADMIN}),
    "api:abort": ("post", {roles.APPROVER, roles.ADMIN}),
    "api:cancel": ("post", {roles.ON_CALL, roles.ADMIN}),
}
PERSONAS = {"on_call": roles.ON_CALL, "approver_user": roles.APPROVER, "admin_user": roles.ADMIN,
            "outsider": None, "dana": None}


# What the API's calls that take a body are sent (well formed: whether the persona may is the question).
BODIES = {"api:ask_from_run": {"fromStep": 1, "reason": "r"},
          "api:ask_since": {"since": "2026-01-01T00:00:00Z", "reason": "r"}}
# django-ninja's root of the API, which only names where it is: no such page, for anyone.
NO_PAGE = {"api:api-root"}


def test_every_url_has_an_access_rule(client, admin_user):
    assert {name for name, _ in named_url_patterns()} == set(ACCESS) | NO_PAGE
    client.force_login(admin_user)
    assert client.get(reverse("api:api-root")).status_code == 404


@pytest.fixture
def objects(dana, on_call, approver_user):
    agent, _ = journal_services.create_agent(name="bot", on_behalf_of=dana)
    run = make_run(agent, steps=2)
    plan = services.request_plan(run=run, requested_by=on_call, reason="r", from_step=1)
    passkey = services.enroll_passkey(user=approver_user, name="k", credential=SoftKey().register(b"c" * 32),
                                      challenge=b"c" * 32)
    first = run.steps.select_related("server").first()
    server = first.server or crm_server()
    action = services.request_for_held_call(
        agent=agent, server=server, tool=first.tool, arguments={"to": "x"},
        decision={"decision": "ask", "class": "none"}, run_id=run.pk, step_id=first.pk)
    rule = services.save_policy(row=AutonomyPolicy(name="All", scope="everything", decisions=dict(
        policy.DEFAULT_DECISIONS)), by=approver_user)
    client = Application.objects.create(
        name="Desktop",
        client_type="public",
        authorization_grant_type="authorization-code",
        redirect_uris="http://localhost:3030/callback",
    )
    authorization = ClientAuthorization.objects.create(application=client, user=dana, agent=agent)
    return {
        "name": agent.name,
        "authorization_id": authorization.pk,
        "run_id": run.public_id,
        "plan_id": plan.public_id,
        "passkey_id": passkey.pk,
        "token_id": services.make_token(user=approver_user, name="script", days=7)[0].pk,
        "position": 1,
        "lease_id": 1,  # none: an admin is told there is no such lease, everyone else is refused first
        "number": 1,
        "action_id": action.public_id,
        "policy_id": rule.pk,
        "server_id": server.pk,
    }


def url_for(name, objects):
    pattern = next(p for p in named_url_patterns() if p[0] == name)[1]
    kwargs = {key: objects[key] for key in pattern.pattern.converters}
    return reverse(name, kwargs=kwargs)


def named_url_patterns(resolver=None, namespace=""):
    for entry in (resolver or get_resolver()).url_patterns:
        if isinstance(entry, URLResolver):
            if entry.namespace in ("journal", "approver", "api"):
                yield from named_url_patterns(entry, entry.namespace)
        elif isinstance(entry, URLPattern) and entry.name and namespace:
            yield f"{namespace}:{entry.name}", entry


@pytest.mark.parametrize("persona", [*PERSONAS, "anonymous"])
def test_every_url_refuses_whoever_its_rule_does_not_allow(persona, objects, request, client, settings):
    settings.WEBAUTHN_RP_ID, settings.WEBAUTHN_ORIGINS = "localhost", ["http://localhost:8000"]
    role = None
    if persona != "anonymous":
        client.force_login(request.getfixturevalue(persona))
        role = PERSONAS[persona]
    for name, (method, allowed) in ACCESS.items():
        url = url_for(name, objects)
        response = getattr(client, method)(url, BODIES.get(name), content_type="application/json") \
            if method == "post" else client.get(url)
        if persona == "anonymous" and name.startswith("api:"):
            assert response.status_code == 401 and response.json()["error"], (name, response.status_code)
        elif persona == "anonymous":
            assert response.status_code == 302 and response.url.startswith(reverse("login")), (
                name,
                response.status_code,
            )
        elif role in allowed or SIGNED_IN in allowed or (persona == "dana" and OWNER in allowed):
            assert response.status_code not in (401, 403), (name, persona, response.status_code)
        elif name in AGENT_PAGES and role not in READERS and persona != "dana":
            assert response.status_code == 404, (name, persona, response.status_code)
        else:
            assert response.status_code == 403, (name, persona, response.status_code)


# The keys that name one run, plan, held call or agent: their pages belong to the agent's team.
TEAM_OBJECTS = {"run_id", "plan_id", "action_id", "name"}


def test_another_teams_people_find_no_such_run_plan_held_call_or_agent(objects, admin_user, client, settings):
    """Every page of one run, plan, held call or agent answers 404 to someone of another team whose role
    would otherwise let them in, word for word as for a name that does not exist; the lists show nothing of
    it. Admins see every team's."""
    settings.WEBAUTHN_RP_ID, settings.WEBAUTHN_ORIGINS = "localhost", ["http://localhost:8000"]
    Team.objects.filter(name=settings.DEFAULT_TEAM).update(everyone=False)  # the objects' team: nobody else
    search = Team.objects.create(name="search")
    for role in (roles.ON_CALL, roles.APPROVER):
        person = User.objects.create_user(username=f"{role}-of-search")
        person.groups.add(Group.objects.get_or_create(name=role)[0])
        search.members.add(person)
        client.force_login(person)
        checked = 0
        for name, (method, allowed) in ACCESS.items():
            pattern = next(p for p in named_url_patterns() if p[0] == name)[1]
            if role not in allowed or not TEAM_OBJECTS & set(pattern.pattern.converters):
                continue
            url = url_for(name, objects)
            response = getattr(client, method)(url, BODIES.get(name), content_type="application/json") \
                if method == "post" else client.get(url)
            assert response.status_code == 404, (name, role, response.status_code)
            checked += 1
        assert checked >= 10, checked
        assert str(objects["run_id"]) not in client.get(reverse("journal:run_list")).content.decode()
        assert client.get(reverse("api:run_list")).json()["items"] == []
        assert str(objects["plan_id"]) not in client.get(reverse("approver:plan_list")).content.decode()
        assert str(objects["action_id"]) not in client.get(reverse("approver:action_list")).content.decode()
        assert objects["name"] not in client.get(reverse("journal:agent_list")).content.decode()
    client.force_login(admin_user)  # an admin, in no team: sees every team's
    assert client.get(url_for("approver:plan_detail", objects)).status_code == 200
    assert str(objects["run_id"]) in client.get(reverse("journal:run_list")).content.decode()
