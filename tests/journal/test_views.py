"""The runs list and the run page: access, content, filters, and constant query counts."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from journal import services
from journal.models import Run

from .factories import crm_server, journal_call, make_run

HATP_RESULT = {
    "content": [{"type": "text", "text": "Deal D-881 stage: Proposal → Won"}],
    "structuredContent": {"deal": {"id": "D-881"}},
    "_meta": {"hatp/journal": {
        "undo": {"kind": "compensate", "window": "P7D", "via": "api", "undoBy": "2099-12-06T10:00:00Z"},
        "compensationToken": "ctk_1", "effect": {"summary": "Deal D-881 stage: Proposal → Won",
                                                  "resource": "crm://acme/deal/D-881", "version": "v13"}}},
}


@pytest.fixture
def agent(dana):
    return services.create_agent(name="sales-bot", on_behalf_of=dana)[0]


@pytest.fixture
def crm(db):
    return crm_server()


PAGES = [
    lambda run: reverse("journal:run_list"),
    lambda run: reverse("journal:run_detail", args=[run.public_id]),
    lambda run: reverse("journal:run_verify", args=[run.public_id]),
    lambda run: reverse("api:run_list"),
    lambda run: reverse("api:run_detail", args=[run.public_id]),
    lambda run: reverse("api:step_list", args=[run.public_id]),
    lambda run: reverse("api:openapi-json"),
]


@pytest.mark.parametrize("page", PAGES)
def test_pages_send_anonymous_users_to_login_and_refuse_users_without_a_role(client, agent, outsider, page):
    url = page(make_run(agent, steps=1))
    response = client.get(url)
    if url.startswith("/api/"):  # an API caller is told to sign in or send a token, not sent to a form
        assert response.status_code == 401 and "Bearer uat_" in response.json()["error"]
    else:
        assert response.status_code == 302 and response.url.startswith(reverse("login"))
    client.force_login(outsider)
    assert client.get(url).status_code == 403


@pytest.mark.parametrize("persona", ["on_call", "approver_user", "admin_user"])
@pytest.mark.parametrize("page", PAGES)
def test_every_role_may_read_runs(client, agent, request, persona, page):
    client.force_login(request.getfixturevalue(persona))
    assert client.get(page(make_run(agent, steps=1))).status_code == 200


def test_run_page_shows_effect_badge_deadline_and_failure(client, agent, crm, on_call):
    journal_call(agent, server=crm, result=HATP_RESULT)
    journal_call(agent, server=crm, error=services.Outcome(error_message="crm refused the connection",
                                                            failure_class="transient"))
    journal_call(agent, server=crm, arguments={"note": "unrelated"}, result=HATP_RESULT)
    run = Run.objects.get()
    client.force_login(on_call)
    html = client.get(reverse("journal:run_detail", args=[run.public_id])).content.decode()
    assert "Deal D-881 stage: Proposal → Won" in html
    assert "Reversible via the API" in html and "hatp/journal (call)" in html
    assert "Undo possible for" in html
    assert "Failed (transient): crm refused the connection" in html
    assert "First step" in html
    # Step 2 passed the deal id that step 1's result returned: an inferred link, with the pointers.
    assert "Depends on <a href=\"#step-1\">step 1</a>" in html
    assert "<code>/structuredContent/deal/id</code> is this call's <code>/deal_id</code>" in html
    assert "Depends on steps 1–2 (all-earlier rule)" in html


def test_run_page_query_count_does_not_grow_with_steps(client, agent, crm, on_call):
    client.force_login(on_call)
    counts = []
    for steps, key in ((3, "run:small"), (60, "run:large")):
        run = make_run(agent, steps=steps, run_key=key, server=crm, result=HATP_RESULT)
        with CaptureQueriesContext(connection) as queries:
            assert client.get(reverse("journal:run_detail", args=[run.public_id])).status_code == 200
        counts.append(len(queries))
    assert counts[0] == counts[1], counts


def test_run_list_query_count_does_not_grow_with_runs(client, agent, on_call):
    client.force_login(on_call)
    counts = []
    for total in (2, 20):
        while Run.objects.count() < total:
            make_run(agent, steps=1, run_key=f"run:{Run.objects.count()}")
        with CaptureQueriesContext(connection) as queries:
            assert client.get(reverse("journal:run_list")).status_code == 200
        counts.append(len(queries))
    assert counts[0] == counts[1], counts


def test_run_list_filters_by_agent_and_state_and_paginates(client, dana, on_call):
    bot, _ = services.create_agent(name="sales-bot", on_behalf_of=dana)
    other, _ = services.create_agent(name="ops-bot", on_behalf_of=dana)
    for index in range(30):
        make_run(bot, steps=1, run_key=f"run:b{index}")
    journal_call(other, run_key="run:o", error=services.Outcome(error_message="x", failure_class="unknown"))
    client.force_login(on_call)
    html = client.get(reverse("journal:run_list"), {"agent": "ops-bot"}).content.decode()
    assert html.count("ops-bot</a>") == 1 and "sales-bot</a>" not in html
    failed = client.get(reverse("journal:run_list"), {"state": "failed"}).content.decode()
    assert "ops-bot</a>" in failed and "sales-bot</a>" not in failed
    first = client.get(reverse("journal:run_list")).content.decode()
    assert "Page 1 of 2" in first
    assert "Page 2 of 2" in client.get(reverse("journal:run_list"), {"page": 2}).content.decode()


def test_run_list_tells_runs_of_one_agent_apart_by_the_name_it_gave_or_its_first_change(client, agent, crm,
                                                                                      on_call):
    journal_call(agent, run_key="run:named", request_meta={"hatp/journal": {"runName": "Renew Globex\u202e"}})
    journal_call(agent, run_key="run:plain", server=crm, result=HATP_RESULT)
    for key, name in (("run:odd", {"not": "a name"}), ("run:long", "x" * 5000)):  # whatever the agent sends
        journal_call(agent, run_key=key, request_meta={"hatp/journal": {"runName": name}})
    client.force_login(on_call)
    html = client.get(reverse("journal:run_list")).content.decode()
    gists = [line.strip() for line in html.split('<span class="gist">')[1:]]
    assert any("Renew Globex" in g and "U+202E" in g for g in gists)  # a hidden character, shown
    assert any(g.startswith("Deal D-881 stage: Proposal → Won</span>") for g in gists)
    assert any(g.startswith("x" * 119 + "…") for g in gists) and html.count('<span class="gist">') == 3
    assert "&quot;not&quot;" not in html  # not a string: no name, and no first change either


def test_run_list_htmx_request_gets_only_the_fragment(client, agent, on_call):
    make_run(agent, steps=1)
    client.force_login(on_call)
    html = client.get(reverse("journal:run_list"), HTTP_HX_REQUEST="true").content.decode()
    assert html.lstrip().startswith('<div id="runs">') and "<html" not in html


def test_a_bad_filter_value_shows_no_runs_rather_than_failing(client, agent, on_call):
    make_run(agent, steps=1)
    client.force_login(on_call)
    response = client.get(reverse("journal:run_list"), {"agent": "nobody", "state": "x"})
    assert response.status_code == 200 and "No runs yet" in response.content.decode()


def test_api_returns_steps_with_undo_facts_and_the_openapi_document_describes_them(
    client, agent, crm, on_call
):
    journal_call(agent, server=crm, result=HATP_RESULT)
    run = Run.objects.get()
    client.force_login(on_call)
    steps = client.get(reverse("api:step_list", args=[run.public_id])).json()
    step = steps["items"][0]
    assert step["undo"]["kind"] == "compensate" and step["effect"]["version"] == "v13"
    schema = client.get(reverse("api:openapi-json")).json()
    assert set(step) == set(schema["components"]["schemas"]["StepOut"]["properties"])
    assert set(client.get(reverse("api:run_detail", args=[run.public_id])).json()) == set(
        schema["components"]["schemas"]["RunOut"]["properties"])


def test_an_unknown_run_is_404(client, on_call):
    client.force_login(on_call)
    assert client.get("/runs/00000000-0000-4000-8000-000000000000/").status_code == 404


def test_verifying_a_run_from_its_page_with_and_without_htmx(client, agent, on_call):
    from journal.models import ChainEntry

    run = make_run(agent, steps=2)
    services.checkpoint_run(run=run)
    client.force_login(on_call)
    url = reverse("journal:run_verify", args=[run.public_id])
    fragment = client.get(url, HTTP_HX_REQUEST="true").content.decode()
    assert fragment.lstrip().startswith('<div id="verdict">') and "Record intact: 5 entries" in fragment
    ChainEntry.objects.filter(run=run, seq=2).update(data={"forged": True})
    page = client.get(url).content.decode()
    assert "<html" in page and "Record broken at entry 2" in page


def test_a_long_run_shows_only_its_changes_and_failures_on_asking_with_its_pager_at_the_top(
        client, agent, crm, on_call, monkeypatch):
    """Issue 44, finding 10: a 420-step run page was 37,000 px tall, with no way to show only the steps that
    changed something or failed, and its pager only at the bottom."""
    from journal import views

    monkeypatch.setattr(views, "STEPS_PER_PAGE", 10)
    services.save_catalogue(server=crm, tools=[*crm.catalogue, {
        "name": "get_deal", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}}])
    for n in range(12):
        journal_call(agent, server=crm, tool="get_deal", arguments={"n": n})
    journal_call(agent, server=crm, tool="update_deal", arguments={"deal_id": "D-881"}, result=HATP_RESULT)
    journal_call(agent, server=crm, tool="get_deal", arguments={"n": "gone"},
                 result={"isError": True, "content": [{"type": "text", "text": "no such deal"}]})
    run = Run.objects.get()
    client.force_login(on_call)
    page = client.get(reverse("journal:run_detail", args=[run.public_id])).content.decode()
    assert page.count('<nav class="pages" aria-label="Steps">') == 2  # above the steps and below
    assert page.index('<nav class="pages"') < page.index('<ol class="timeline">')
    assert "Steps 1–10 of 14" in page and 'href="?only=changes"' in page
    only = client.get(reverse("journal:run_detail", args=[run.public_id]) + "?only=changes").content.decode()
    shown = [n for n in range(1, 15) if f'id="step-{n}"' in only]
    assert shown == [13, 14], shown  # the change and the failure, and no read that went well
    assert "Showing only the steps that changed something or failed" in only
    assert '<nav class="pages"' not in only
