"""Webhooks a company can trust: a real HTTP receiver checks every delivery's signature (HMAC-SHA256 over the
timestamp and the body, with the endpoint's secret), answers the first attempt with a 500, and, seeing the
same delivery id again on the retry, acts on it once; deliveries are kept with their status, sent again with
backoff, and given up after the last attempt."""

import hashlib
import hmac
import json
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from approver import services, tasks
from approver.models import Plan, WebhookDelivery, WebhookEndpoint
from approver.services import webhooks
from journal.models import Team
from tests.conftest import free_port

from .services.test_approvals import approve, conflicted_plan, enrolled, relying_party  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db(transaction=True)


class Receiver:
    """An incident tool's webhook endpoint: it verifies, fails on request, and acts on each id once."""

    def __init__(self, secret: str, fail_first: int = 1):
        self.secret, self.fail_first = secret, fail_first
        self.attempts, self.acted, self.refused = [], [], []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                verdict = receiver.verify(self.headers, body)
                receiver.attempts.append(self.headers[webhooks.ID_HEADER])
                if verdict:
                    receiver.refused.append(verdict)
                    self.send_response(400)
                elif len(receiver.attempts) <= receiver.fail_first:
                    self.send_response(500)
                else:
                    event = json.loads(body)
                    if event["id"] not in {seen["id"] for seen in receiver.acted}:
                        receiver.acted.append(event)
                    self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def verify(self, headers, body: bytes) -> str:
        parts = dict(part.split("=", 1) for part in headers[webhooks.SIGNATURE_HEADER].split(","))
        signed = f"{parts['t']}.".encode() + body
        expected = hmac.new(self.secret.encode(), signed, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, parts["v1"]):
            return "bad signature"
        if abs(time.time() - int(parts["t"])) > 300:
            return "too old"
        if json.loads(body)["id"] != headers[webhooks.ID_HEADER]:
            return "id differs"
        return ""


@pytest.fixture
def receiver():
    made = Receiver(webhooks.new_secret())
    yield made
    made.server.shutdown()


def test_a_delivery_is_signed_retried_after_a_500_and_acted_on_once(receiver, monkeypatch):
    rung = []
    monkeypatch.setattr(webhooks.bell, "ring",
                        lambda task, *args, countdown=None: rung.append((args, countdown)))
    WebhookEndpoint.objects.create(url=receiver.url, secret=receiver.secret)
    assert webhooks.emit("plan.ready", {"plan": "p-1", "summary": "Undo 2 actions"}, team_id=None) == 1
    delivery = WebhookDelivery.objects.get()
    assert webhooks.deliver(delivery.pk) == "will try again"
    delivery.refresh_from_db()
    assert (delivery.state, delivery.attempts, delivery.last_status) == ("pending", 1, 500)
    assert rung[-1] == ((delivery.pk,), 10.0)  # rung again after the backoff
    assert webhooks.deliver(delivery.pk) == "not due"  # not before its time
    assert webhooks.deliver(delivery.pk, now=timezone.now() + timedelta(seconds=11)) == "delivered"
    delivery.refresh_from_db()
    assert delivery.state == "delivered" and delivery.attempts == 2 and delivery.delivered_at
    assert webhooks.deliver(delivery.pk, now=timezone.now() + timedelta(hours=1)) == "not due"
    # The receiver saw the same id twice, checked both signatures, and acted once.
    assert receiver.attempts == [str(delivery.public_id)] * 2 and receiver.refused == []
    assert [(e["type"], e["data"]["plan"]) for e in receiver.acted] == [("plan.ready", "p-1")]


def test_a_wrong_secret_is_refused_by_the_receiver_and_the_delivery_gives_up_in_the_end(
        receiver, monkeypatch, settings):
    monkeypatch.setattr(webhooks.bell, "ring", lambda *args, **kwargs: None)
    settings.WEBHOOK_MAX_ATTEMPTS = 2
    WebhookEndpoint.objects.create(url=receiver.url, secret=webhooks.new_secret())  # not the receiver's
    webhooks.emit("lease.broken", {"plan": "p-2"}, team_id=None)
    delivery = WebhookDelivery.objects.get()
    later = timezone.now()
    for _ in range(2):
        later += timedelta(hours=2)
        webhooks.deliver(delivery.pk, now=later)
    delivery.refresh_from_db()
    assert (delivery.state, delivery.attempts, delivery.last_status) == ("failed", 2, 400)
    assert receiver.refused == ["bad signature"] * 2 and receiver.acted == []
    webhooks.send_again(delivery=delivery)
    delivery.refresh_from_db()
    assert (delivery.state, delivery.attempts) == ("pending", 0)


def test_an_endpoint_hears_only_its_events_and_its_team(monkeypatch):
    monkeypatch.setattr(webhooks.bell, "ring", lambda *args, **kwargs: None)
    payments, search = Team.objects.create(name="payments"), Team.objects.create(name="search")
    every = WebhookEndpoint.objects.create(url="http://127.0.0.1:9/a", secret="s")
    held_only = WebhookEndpoint.objects.create(url="http://127.0.0.1:9/b", secret="s",
                                               events=["held_call.waiting"])
    theirs = WebhookEndpoint.objects.create(url="http://127.0.0.1:9/c", secret="s", team=payments)
    WebhookEndpoint.objects.create(url="http://127.0.0.1:9/d", secret="s", is_active=False)
    webhooks.emit("plan.ready", {}, team_id=search.pk)
    webhooks.emit("held_call.waiting", {}, team_id=payments.pk)
    heard = sorted((d.endpoint_id, d.event) for d in WebhookDelivery.objects.all())
    assert heard == sorted([(every.pk, "plan.ready"), (every.pk, "held_call.waiting"),
                            (held_only.pk, "held_call.waiting"), (theirs.pk, "held_call.waiting")])


def test_an_endpoint_that_does_not_answer_is_kept_pending_with_the_error(monkeypatch):
    monkeypatch.setattr(webhooks.bell, "ring", lambda *args, **kwargs: None)
    WebhookEndpoint.objects.create(url=f"http://127.0.0.1:{free_port()}/nobody", secret="s")
    webhooks.emit("plan.finished", {"plan": "p-3"}, team_id=None)
    delivery = WebhookDelivery.objects.get()
    assert webhooks.deliver(delivery.pk) == "will try again"
    delivery.refresh_from_db()
    assert delivery.last_status is None and "ConnectError" in delivery.last_error


def test_the_globex_undo_tells_the_webhook_each_step_and_the_receiver_checks_every_one(
        conflicted_plan, approver_user, second_approver, admin_user, receiver, sample_servers,  # noqa: F811
        monkeypatch):
    """Ready, an override, approved, finished, and a held call waiting: each from the place that decides it,
    each signed, each acted on once though the first delivery is answered 500."""
    monkeypatch.setattr(webhooks.bell, "ring", lambda *args, **kwargs: None)
    WebhookEndpoint.objects.create(url=receiver.url, secret=receiver.secret)
    plan = conflicted_plan
    tasks.notify_plan_ready(plan.pk, plan.check_round)
    approve(plan, approver_user, enrolled(approver_user))  # overwrites priya's newer change, with a reason
    approve(plan, second_approver, enrolled(second_approver))
    tasks.notify_plan_decided(plan.pk)
    services.execute_plan(plan=Plan.objects.get(pk=plan.pk), later=lambda seconds: None)
    tasks.notify_plan_executed(plan.pk)
    step = plan.run.steps.get(number=4)
    services.request_for_held_call(
        agent=plan.run.agent, server=step.server, tool="send_email", arguments={"to": "x@globex.example"},
        decision={"decision": "ask", "class": "none"}, run_id=plan.run_id, step_id=step.pk)
    tasks.notify_action_requested(0)
    later = timezone.now()
    for _ in range(3):  # the worker's rounds: what failed is sent again once its backoff is over
        later += timedelta(minutes=5)
        for delivery in WebhookDelivery.objects.filter(state="pending").order_by("pk"):
            webhooks.deliver(delivery.pk, now=later)
    assert set(WebhookDelivery.objects.values_list("state", flat=True)) == {"delivered"}
    assert receiver.refused == [] and len(receiver.attempts) == WebhookDelivery.objects.count() + 1
    made = [d.event for d in WebhookDelivery.objects.order_by("pk")]
    assert made == ["plan.ready", "plan.override", "plan.approved", "plan.finished", "held_call.waiting"]
    acted = {event["type"]: event["data"] for event in receiver.acted}
    assert sorted(acted) == sorted(made) and len(receiver.acted) == len(made)  # the retried one, once
    assert acted["plan.ready"]["plan"] == str(plan.public_id) and acted["plan.ready"]["team"] == "everyone"
    assert acted["plan.override"]["by"] == "ana" and acted["plan.override"]["changedBy"] == "priya"
    plan.refresh_from_db()
    assert acted["plan.finished"]["result"] == plan.execution_summary and acted["plan.finished"]["state"] == (
        plan.state)
    assert acted["held_call.waiting"]["call"] == "mail__send_email"


def test_admins_register_an_endpoint_with_a_secret_made_for_it_and_see_every_delivery(client, monkeypatch):
    monkeypatch.setattr(webhooks.bell, "ring", lambda *args, **kwargs: None)
    client.force_login(User.objects.create_superuser("root", password="root-password-1"))
    made = client.post("/admin/approver/webhookendpoint/add/", {
        "url": "https://hooks.acme.example/undo", "description": "PagerDuty", "events": ["plan.ready"],
        "is_active": "on"})
    assert made.status_code == 302
    endpoint = WebhookEndpoint.objects.get()
    assert endpoint.secret.startswith("whsec_") and endpoint.events == ["plan.ready"]
    page = client.get(f"/admin/approver/webhookendpoint/{endpoint.pk}/change/").content.decode()
    assert endpoint.secret in page
    webhooks.emit("plan.ready", {"plan": "p-4"}, team_id=None)
    delivery = WebhookDelivery.objects.get()
    WebhookDelivery.objects.filter(pk=delivery.pk).update(state="failed", attempts=8, last_status=503)
    listing = client.get("/admin/approver/webhookdelivery/").content.decode()
    assert "plan.ready" in listing and "Gave up" in listing and "503" in listing
    client.post("/admin/approver/webhookdelivery/",
                {"action": "send_again", "_selected_action": [delivery.pk]})
    delivery.refresh_from_db()
    assert (delivery.state, delivery.attempts) == ("pending", 0)


def test_in_production_an_endpoint_must_be_https_and_its_secret_can_be_made_anew(client, settings):
    settings.PRODUCTION = True
    client.force_login(User.objects.create_superuser("root", password="root-password-1"))
    refused = client.post("/admin/approver/webhookendpoint/add/", {"url": "http://hooks.acme.example/undo",
                                                                   "is_active": "on"})
    assert refused.status_code == 200 and "over https only" in refused.content.decode()
    assert not WebhookEndpoint.objects.exists()
    endpoint = WebhookEndpoint.objects.create(url="https://hooks.acme.example/undo", secret="whsec_old")
    client.post("/admin/approver/webhookendpoint/",
                {"action": "new_secret", "_selected_action": [endpoint.pk]})
    endpoint.refresh_from_db()
    assert endpoint.secret.startswith("whsec_") and endpoint.secret != "whsec_old"


def test_a_worker_that_dies_between_the_claim_and_the_delivery_loses_neither(
        conflicted_plan, approver_user, second_approver, receiver, monkeypatch, mailoutbox):  # noqa: F811
    """The telling of a ready plan is claimed and its delivery kept in one transaction: a worker that dies
    in between leaves both undone, and the next run (beat rings again) tells the approvers and the webhook."""
    monkeypatch.setattr(webhooks.bell, "ring", lambda *args, **kwargs: None)
    WebhookEndpoint.objects.create(url=receiver.url, secret=receiver.secret)
    for approver in (approver_user, second_approver):
        approver.email = f"{approver.username}@acme.example"
        approver.save()
    plan = conflicted_plan

    def killed(*args, **kwargs):
        raise SystemExit("the worker was killed here")

    with monkeypatch.context() as patched:
        patched.setattr(webhooks, "emit", killed)
        with pytest.raises(SystemExit):
            tasks.notify_plan_ready(plan.pk, plan.check_round)
    assert Plan.objects.get(pk=plan.pk).ready_notified_round < plan.check_round  # the claim went with it
    assert not WebhookDelivery.objects.exists() and mailoutbox == []
    assert tasks.notify_plan_ready(plan.pk, plan.check_round) == 1  # the next run: one email, to both
    assert sorted(mailoutbox[0].to) == ["ana@acme.example", "bo@acme.example"]
    assert [d.event for d in WebhookDelivery.objects.all()] == ["plan.ready"]
    assert tasks.notify_plan_ready(plan.pk, plan.check_round) == 0  # and only once
    assert WebhookDelivery.objects.count() == 1
