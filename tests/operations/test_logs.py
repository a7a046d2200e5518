"""Log lines people can search, and that leak nothing: with LOG_FORMAT=json every line the Recorder writes
is one JSON object, a call's lines name its agent, run and step and carry its trace and span ids, and no line,
at DEBUG, holds an agent's token, a person's API token or password, or a webhook's secret."""

import io
import json
import logging

import anyio
import httpx2
import pytest

from approver import services, traced
from approver.services import tokens
from journal import services as journal_services
from journal.models import Run
from journal.telemetry import logs
from samples import agent as scripted
from tests.journal.helpers import register_samples
from tests.otlp import Receiver
from tests.services import worker_env_for_test_database

from .test_metrics import recorders

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("line, secret", [
    ("Authorization: Bearer agt_Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5", "agt_Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5"),
    ("headers={'authorization': 'Bearer 0a1b2c3d4e5f60718293'}", "0a1b2c3d4e5f60718293"),
    ('{"username": "ana", "password": "correct horse"}', "correct"),
    ("POST /token?client_secret=s3cr3tvalue&grant_type=x", "s3cr3tvalue"),
    ("Cookie: sessionid=abcdef123456; csrftoken=zyxwvu987654", "abcdef123456"),
    ("refresh_token=rt-998877665544", "rt-998877665544"),
    ("id token eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJl", "eyJzdWIiOiIxMjM0NTY3ODkwIn0"),
    ("signing with whsec_Q2hhbmdlIG1lIHBsZWFzZQ", "whsec_Q2hhbmdlIG1lIHBsZWFzZQ"),
    ("the token uat_dGhpcyBpcyBhIHRva2Vu was revoked", "uat_dGhpcyBpcyBhIHRva2Vu"),
])
def test_each_kind_of_secret_is_struck_out(line, secret):
    assert secret not in logs.redact(line) and logs.STRUCK in logs.redact(line)


def test_a_line_keeps_what_is_no_secret():
    line = "could not journal the outcome of step 3 of run 5c1f; the reconciler will mark it"
    assert logs.redact(line) == line


def test_a_records_arguments_and_its_exception_are_struck_too():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(logs.Redact())
    handler.setFormatter(logs.Json())
    logger = logging.getLogger("tests.redact")
    logger.addHandler(handler)
    try:
        try:
            raise ValueError("password=hunter2-hunter2")
        except ValueError:
            logger.error("sign-in for %s with %s failed", "ana", "Bearer agt_aaaaaaaaaaaaaaaaaaaa",
                         exc_info=True)
    finally:
        logger.removeHandler(handler)
    line = json.loads(stream.getvalue())
    assert "hunter2" not in stream.getvalue() and "agt_aaaa" not in stream.getvalue()
    assert line["message"] == "sign-in for ana with Bearer [redacted] failed" and line["level"] == "ERROR"


def test_a_plans_lines_name_the_plan(globex, on_call, caplog):
    plan = services.request_plan(run=globex, requested_by=on_call, reason="r", from_step=2)
    filtering = logs.Context()
    with caplog.at_level(logging.INFO), traced.plan_span(plan, "plan checks"):
        logging.getLogger("approver.test").info("checking")
    [record] = [r for r in caplog.records if r.name == "approver.test"]
    assert filtering.filter(record) and record.plan == ""  # bound only while the span lasts: read it inside
    with traced.plan_span(plan, "plan checks"):
        record = logging.LogRecord("approver.test", logging.INFO, __file__, 1, "checking", None, None)
        filtering.filter(record)
    assert record.plan == str(plan.public_id)


def test_json_lines_name_their_call_and_hold_no_secret(sample_servers, dana, approver_user, tmp_path):
    register_samples(sample_servers, names=("crm",))
    _, agent_token = journal_services.create_agent(name="sales-bot", on_behalf_of=dana)
    _, api_token = tokens.make_token(user=approver_user, name="incident tool", days=7, scope="read")
    receiver = Receiver()
    env = {**worker_env_for_test_database(), **receiver.env(), "LOG_FORMAT": "json", "LOG_LEVEL": "DEBUG",
           "DEBUG": "1"}
    log_path = tmp_path / "recorder.log"
    try:
        with open(log_path, "w") as log, recorders(env, workers=1, log=log) as base:
            anyio.run(lambda: scripted.replay(f"{base}/mcp/", agent_token, say=lambda _: None,
                                              story=scripted.STORY[:2]))
            with httpx2.Client(base_url=base, timeout=10) as http:
                for token, status in ((api_token, 200), (f"{api_token}x", 401)):
                    answer = http.get("/api/plans/", headers={"Authorization": f"Bearer {token}"})
                    assert answer.status_code == status
                http.get("/login/")
                http.post("/login/", data={"username": "ana", "password": "ana-password-1"})
                http.post("/mcp/", json={},
                          headers={"Authorization": "Bearer agt_not-a-real-token-0123456789"})
    finally:
        receiver.close()
    text = log_path.read_text()
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]  # every line is one object
    for secret_text in (agent_token, api_token, "ana-password-1", "agt_not-a-real-token"):
        assert secret_text not in text
    run = str(Run.objects.get(agent__name="sales-bot").public_id)
    calls = [line for line in lines if line["logger"] == "journal.telemetry.calls"]
    assert [(c["agent"], c["run"], c["step"]) for c in calls] == [("sales-bot", run, n) for n in (1, 2)]
    traces = {span["trace"] for span in receiver.spans}
    assert all(c["trace_id"] in traces and len(c["trace_id"]) == 32 and len(c["span_id"]) == 16
               for c in calls)
    assert {"time", "level", "logger", "message", "process"} <= set(lines[0])
