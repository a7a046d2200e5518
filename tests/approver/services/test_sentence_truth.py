"""Issue 44, build item 1: one computed sentence says what signing does, and it is true. For each kind of item
(HATP, SEP-3172, ChronoMCP, undo through an app's screens, an admin's recipe, cannot be undone, left alone
as the approvers chose, an override), the sentence is computed before signing; the plan is signed and run by
the real executor against the real servers; what the sentence said would be undone is exactly what was undone
(the servers' ledgers and the disk say so), and what it said is left alone or cannot be undone was not sent.
The page, the approvers' email and the plan's JSON carry the same words."""

from types import SimpleNamespace

import pytest
from django.core import mail
from django.test import Client
from django.utils.html import escape

from approver import execution, notifications, sentence, services, tasks
from approver.models import Plan
from journal import services as journal_services
from journal.models import Run, Step
from journal.undo import recipe_text
from tests.journal.helpers import register_samples, run_agent
from tests.services import needs_node

from .test_approvals import approve, enrolled, relying_party  # noqa: F401 - fixture and helpers
from .test_executor import run_plan
from .test_recipe_undo import pinned_server

pytestmark = pytest.mark.django_db(transaction=True)

# What the executor must have done with an item, by what the sentence said of it.
DONE = {execution.UNDO: {execution.COMPENSATED}, execution.LEAVE: {execution.SKIPPED},
        execution.CANNOT: {execution.IRREVERSIBLE},
        execution.NOTHING: {execution.NO_COMPENSATION, execution.ALREADY_UNDONE}}


def checked(run, on_call) -> Plan:
    plan = services.request_plan(run=run, requested_by=on_call, reason="wrong customer", from_step=1)
    return services.run_checks(plan=plan, check_round=plan.check_round)


def said_then_done(plan: Plan, approvers, choices: dict[str, str]) -> tuple[sentence.Sentence, Plan]:
    """Sign `plan` with `choices`, read the sentence as signed, run it; every item did what it said."""
    for user in approvers:
        approve(plan, user, enrolled(user), choices=choices)
    plan = Plan.objects.get(pk=plan.pk)
    items = list(services.items_for_page(plan))
    said = sentence.of_items(items)
    intents = {i.pk: execution.intent(i.action, i.conflict_choice) for i in items}
    plan = run_plan(plan)
    outcomes = {i.pk: i.outcome for i in plan.items.all()}
    for pk, intent in intents.items():
        assert outcomes[pk] in DONE[intent], (pk, intent, outcomes[pk])
    assert len(said.undo) == sum(o == execution.COMPENSATED for o in outcomes.values())
    assert len(said.cannot) == sum(o == execution.IRREVERSIBLE for o in outcomes.values())
    assert not said.choose  # every conflict was chosen for before signing
    return said, plan


def test_the_page_the_email_and_the_json_say_the_same_sentence(globex, on_call, approver_user,
                                                               sample_servers):
    sample_servers.colleague_update("D-881", {"amount": 45000}, by="priya")
    plan = checked(globex, on_call)
    approver_user.email = "ana@acme.example"
    approver_user.save()
    mail.outbox.clear()
    notifications.plan_ready(plan)
    words = sentence.of_items(list(services.items_for_page(plan))).text()
    assert words == (
        "Signing will: cancel 'Kickoff with Globex' on Dec 4: attendees get a cancellation notice. Cannot be "
        "undone: emailed 'Welcome aboard, Globex' to buyer@globex.example (remedy: send a correction email). "
        "Choose first, for each record changed since: deal D-881 (priya changed it since the agent).")
    assert mail.outbox and mail.outbox[0].body.startswith(words + "\n")
    web = Client()
    web.force_login(approver_user)
    enrolled(approver_user)
    body = web.get(f"/api/plans/{plan.public_id}/").json()
    assert body["sentence"]["text"] == words and body["sentence"]["choose"] == [
        "deal D-881 (priya changed it since the agent)"]
    page = web.get(f"/plans/{plan.public_id}/").content.decode()
    assert f'<p class="sentence" id="sentence"><strong>{escape(words)}</strong></p>' in page
    assert f'<p class="sign-sentence" id="sign-sentence">{escape(words)}</p>' in page  # by the button
    # Someone who may not sign reads what the plan does once approved, in the same words.
    web.force_login(on_call)
    page = web.get(f"/plans/{plan.public_id}/").content.decode()
    assert escape(words.replace("Signing will:", "Once approved, this plan will:")) in page


@pytest.fixture
def no_bell(monkeypatch):
    monkeypatch.setattr(tasks.execute_plan, "delay", lambda *args: None)


def test_hatp_an_override_and_what_cannot_be_undone(globex, on_call, approver_user, second_approver,
                                                    sample_servers, no_bell):
    sample_servers.colleague_update("D-881", {"amount": 45000}, by="priya")
    plan = checked(globex, on_call)
    said, plan = said_then_done(plan, (approver_user, second_approver), {"3": "overwrite"})
    assert said.undo[1] == "put back deal D-881's stage to Proposal (priya changed other fields since: the " \
                           "approvers chose to undo anyway)"
    assert said.keep == ("priya's amount change",)
    assert said.cannot[0].startswith("emailed 'Welcome aboard, Globex' to buyer@globex.example (remedy:")
    # What the servers did: the kickoff cancelled, the stage put back and priya's amount kept; no email sent.
    [deal] = [e for e in sample_servers.ledger("crm") if e["op"] == "compensate"]
    assert deal["restored"] == {"stage": "Proposal"}  # the amount, priya's, untouched
    [kickoff] = [e for e in sample_servers.ledger("calendar") if e["op"] == "compensate"]
    assert plan.items.get(step__tool="create_event").step.effect_resource.endswith(kickoff["resource"])
    assert [e["op"] for e in sample_servers.ledger("mail") if e["op"] == "compensate"] == []
    # The run page shows the steps as they are now: undone, not "Reversible via the API".
    web = Client()
    web.force_login(on_call)
    page = web.get(f"/runs/{globex.public_id}/").content.decode()
    badges = [page.split(f'id="step-{n}"', 1)[1].split('<span class="badge ', 1)[1].split("</span>", 1)[0]
              for n in (1, 2, 3, 4)]
    assert badges == ['read-only">Read-only', 'undone">Undone', 'undone">Undone',
                      'irreversible">Cannot be undone']
    # The runs list reads the undo run as one: no "Unknown" count of calls that are undos themselves.
    rows = web.get("/runs/").content.decode().split("<tr>")
    [undo_row] = [row for row in rows if "undo calls of" in row]
    assert undo_row.count('class="num undo-calls"') == 3 and 'class="num unknown"' not in undo_row


def test_an_undo_left_alone_is_not_sent(globex, on_call, approver_user, second_approver, sample_servers,
                                        no_bell):
    sample_servers.colleague_update("D-881", {"amount": 45000}, by="priya")
    plan = checked(globex, on_call)
    said, plan = said_then_done(plan, (approver_user, second_approver), {"3": "keep_newer"})
    assert said.keep == ("deal D-881 as priya left it (the agent's change “Deal D-881 stage: Proposal → Won” "
                         "stays)",)
    assert not [e for e in sample_servers.ledger("crm") if e["op"] == "compensate"]


def test_sep3172_and_chronomcp(recorder, sample_servers, dana, on_call, approver_user, second_approver,
                               no_bell):
    register_samples(sample_servers, names=("payments", "inventory"))
    _, token = journal_services.create_agent(name="shop-bot", on_behalf_of=dana)

    async def script(client):
        meta = {"hatp/journal": {"runId": "shop"}}
        await client.call_tool("payments__charge_payment", {"customer": "globex", "amount": "2500.00"},
                               meta=meta)
        await client.call_tool("inventory__reserve_inventory", {"sku": "SKU-GLOBEX-KIT", "quantity": 3},
                               meta=meta)

    run_agent(recorder, token, script)
    said, plan = said_then_done(checked(Step.objects.get(tool="charge_payment").run, on_call),
                                (approver_user, second_approver), {})
    # Each in its server's words, with the thing it is called on (issue 44, build item 5).
    release, refund = said.undo
    assert release.startswith("release a hold: release_inventory {id: \"res_") and \
        release.endswith("\"} on inventory"), release
    assert refund.startswith("refund a charge in full: refund_payment {transactionId: \"") and \
        refund.endswith("\"} on payments"), refund
    assert [e["op"] for e in sample_servers.ledger("payments")][-1] == "refund"
    assert [e["op"] for e in sample_servers.ledger("inventory")][-1] == "release"


def test_undo_through_an_apps_screens(recorder, sample_servers, dana, on_call, approver_user,
                                      second_approver, no_bell):
    register_samples(sample_servers, names=("desk",))
    _, token = journal_services.create_agent(name="desk-bot", on_behalf_of=dana)

    async def script(client):
        await client.call_tool("desk__edit_record", {"id": "C-77", "status": "Customer", "owner": "bo"})

    run_agent(recorder, token, script)
    said, plan = said_then_done(checked(Step.objects.get(tool="edit_record").run, on_call),
                                (approver_user, second_approver), {})
    assert len(said.undo) == 1 and said.undo[0].startswith("put back C-77")
    assert [e["record"] for e in sample_servers.ledger("desk") if e["op"] == "compensate"] == ["C-77"]


@needs_node
def test_an_admins_recipe(recorder, dana, admin_user, on_call, approver_user, second_approver, tmp_path,
                          no_bell):
    world = tmp_path / "world"
    pinned_server("filesystem", world, by=admin_user, name="fs")
    _, token = journal_services.create_agent(name="files-bot", on_behalf_of=dana)
    (world / "brief.md").write_bytes(b"# Brief\n")

    async def script(client):
        await client.call_tool("fs__write_file", {"path": str(world / "brief.md"), "content": "replaced\n"})
        await client.call_tool("fs__write_file", {"path": str(world / "new.md"), "content": "new\n"})

    run_agent(recorder, token, script)
    said, plan = said_then_done(checked(Run.objects.get(agent__name="files-bot"), on_call),
                                (approver_user, second_approver), {})
    assert len(said.undo) == 1 and "restore the file's earlier content" in said.undo[0]
    assert len(said.cannot) == 1 and "(remedy: Delete the file by hand" in said.cannot[0]
    assert (world / "brief.md").read_bytes() == b"# Brief\n" and (world / "new.md").exists()


def step(**fields):
    return SimpleNamespace(**{"number": 1, "tool": "update_deal", "server_name": "crm", "effect_summary": "",
                              "effect_resource": "", "effect_fields": None, **fields})


def item(action="compensate", choice="", check="ok", detail=None, **fields):
    return SimpleNamespace(action=action, conflict_choice=choice, check_status=check,
                           check_detail=detail or {},
                           tool=fields.pop("tool", "undo_it"), remedy=fields.pop("remedy", ""),
                           step=step(**fields))


def test_the_sentence_as_a_pure_function():
    conflict = {"current": {"changedBy": "priya"}, "threeWay": {"fields": [
        {"field": "stage", "before": "Proposal", "left": "Won", "now": "Lost"}]}}
    said = sentence.of_items([
        item(detail={"wouldDo": "Cancel 'Kickoff'."}),
        item(choice="overwrite", check="conflict", detail=conflict, effect_resource="crm://acme/deal/D-1",
             effect_fields={"before": {"stage": "Proposal"}, "after": {"stage": "Won"}}),
        item(choice="keep_newer", check="conflict", detail=conflict, effect_resource="crm://acme/deal/D-2",
             effect_summary="Deal D-2 stage: Proposal → Won"),
        item(check="conflict", detail=conflict, effect_resource="crm://acme/deal/D-3"),
        item(check="expired", detail={"message": "The undo window closed at 10:00."},
             effect_summary="Booked a room"),
        item(action="cannot_undo", effect_summary="Sent the SMS", remedy="call them."),
        item(action="nothing_to_undo"),
    ])
    assert said.text() == (
        "Signing will: cancel 'Kickoff'; put back deal D-1's stage to Proposal, overwriting priya's change "
        "to the stage, as the approvers chose; take back the agent's change “Booked a room” (its check said: "
        "the undo window closed at 10:00). It will not touch: deal D-2 as priya left it (the agent's change "
        "“Deal D-2 stage: Proposal → Won” stays). Cannot be undone: sent the SMS (remedy: call them). Choose "
        "first, for each record changed since: deal D-3 (priya changed it since the agent).")
    assert sentence.of_items([item(choice="keep_newer")]).text("Approved, this plan will") == (
        "Approved, this plan will undo nothing. It will not touch: step 1's update_deal as it is now (the "
        "agent's change stays).")
    assert recipe_text.record_name("crm://acme/deal/D-881") == "deal D-881"
    assert recipe_text.record_name("/srv/world/brief.md") == "brief.md"
    assert recipe_text.record_name('read_text_file {path: "/srv/world/brief.md"}') == "brief.md"
    assert recipe_text.record_name('open_nodes {names: ["Dana", "Globex kickoff"]}') == "Dana, Globex kickoff"
    assert recipe_text.record_name('open_nodes {"names":["Globex kickoff"]}') == "Globex kickoff"
