"""The audit stream: every entry of every run's record, as it is committed, to the company's SIEM, at least
once and in order per run, resumed after a restart from the last entry delivered; each event checkable
against the signed record (run, seq, the entry's hash over its own content)."""

import hashlib
import hmac
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anyio
import httpx2
import pytest
import rfc8785
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from journal import services as journal_services
from journal.audit import lag, sinks, stream
from journal.models import AuditPosition, AuditSink, ChainEntry, Run, ToolServer
from journal.record import chain
from journal.services import notices
from samples import agent as scripted
from tests.conftest import free_port
from tests.journal.helpers import register_samples
from tests.otlp import Receiver
from tests.services import worker_env_for_test_database
from tests.syslog import SyslogReceiver

pytestmark = pytest.mark.django_db(transaction=True)


def start_recorder(env: dict, port: int) -> subprocess.Popen:
    """The Recorder as a uvicorn process in a process group of its own (so a test can kill all of it)."""
    web = subprocess.Popen([sys.executable, "-m", "uvicorn", "approver.asgi:application", "--port", str(port),
                            "--log-level", "warning"], env=env, start_new_session=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx2.get(f"http://127.0.0.1:{port}/login/", timeout=2).status_code == 200:
                return web
        except httpx2.HTTPError:
            pass
        if time.monotonic() > deadline or web.poll() is not None:
            raise RuntimeError("the Recorder did not start")
        time.sleep(0.2)


def every_entry() -> dict[tuple[str, int], str]:
    return {(str(run), seq): digest for run, seq, digest in
            ChainEntry.objects.values_list("run__public_id", "seq", "hash")}


def checked(event: dict) -> None:
    """The event is the record's entry: its hash is the SHA-256 of the JCS of its own content."""
    body = {key: event[key] for key in ("seq", "ts", "event", "data", "prevHash")}
    assert hashlib.sha256(rfc8785.dumps(body)).hexdigest() == event["hash"]


@pytest.mark.postgres
def test_a_recorder_killed_while_the_stream_is_behind_delivers_every_entry_after_its_restart(
        sample_servers, dana):
    register_samples(sample_servers, names=("legacy",))
    tokens = [journal_services.create_agent(name=f"bot-{n}", on_behalf_of=dana)[1] for n in range(3)]
    siem = WebhookReceiver("audit-secret-1", fail_first=False)
    env = {**worker_env_for_test_database(), "AUDIT_STREAM": siem.url,
           "AUDIT_WEBHOOK_SECRET": "audit-secret-1"}
    port = free_port()

    def agents(first: int):
        async def calls():
            async with anyio.create_task_group() as group:
                for n, token in enumerate(tokens):
                    group.start_soon(lambda t=token, n=n: scripted.replay(
                        f"http://127.0.0.1:{port}/mcp/", t, run_id=f"audited-{n}", say=lambda _: None,
                        story=[("legacy__echo", {"n": i}) for i in range(first, first + 6)]))

        anyio.run(calls)

    web = start_recorder(env, port)
    try:
        agents(0)
        sink_id = wait_for(lambda: AuditSink.objects.filter(name=sinks.shown(siem.url))
                           .values_list("pk", flat=True).first(), "the sink's lease")
        wait_for(lambda: lag.lag(sink_id, timezone.now())[0] == 0, "the first calls' delivery")
        siem.stalled.set()  # the SIEM takes the next batch and does not answer
        agents(6)
        wait_for(lambda: siem.held, "the next batch")
        behind, _ = lag.lag(sink_id, timezone.now())
        assert behind > 0  # the stream is behind: that batch is sent, not yet known to be taken
        os.killpg(web.pid, signal.SIGKILL)  # the Recorder dies mid-stream, nothing said to anybody
        web.wait(timeout=10)
        siem.stalled.clear()
        web = start_recorder(env, port)  # started again: it takes over the sink at once and sends again
        entries = every_entry()
        wait_for(lambda: {(e["run"], e["seq"]) for e in siem.events()} == set(entries)
                 and lag.lag(sink_id, timezone.now())[0] == 0, "every entry's delivery after the restart")
    finally:
        os.killpg(web.pid, signal.SIGTERM)
        web.wait(timeout=20)
        siem.server.shutdown()
    events = siem.events()
    assert {(e["run"], e["seq"]): e["hash"] for e in events} == entries  # none lost, each the record's own
    assert len({e["run"] for e in events}) == 3 and siem.refused == []
    for run in {e["run"] for e in events}:
        arrived = [e["seq"] for e in events if e["run"] == run]
        first_times = [seq for n, seq in enumerate(arrived) if seq not in arrived[:n]]
        assert first_times == list(range(1, len(first_times) + 1))  # in order, no gap
    # Duplicates: only the batch that was on its way when the Recorder died, sent again whole.
    assert len(events) - len(entries) == len(siem.batches[siem.held_index])
    seen: dict = {}
    for event in events:
        checked(event)
        assert seen.setdefault((event["run"], event["seq"]), event) == event  # a duplicate is the same event


def wait_for(predicate, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        assert time.monotonic() < deadline, f"{what} did not happen in {timeout} s"
        time.sleep(0.1)
    return found


def test_syslog_messages_are_rfc5424_octet_counted_in_order_with_what_a_siem_checks(globex):
    siem = SyslogReceiver()
    syslog = sinks.sink_for(siem.address)
    streamer = stream.Streamer([syslog])
    try:
        while streamer.turn(syslog, 0) == (0, 0):
            pass
        count = globex.entries.count()
        wait_for(lambda: len(siem.messages) == count, "the messages")
    finally:
        syslog.close()
        siem.close()
    assert [m["event"]["seq"] for m in siem.messages] == list(range(1, count + 1))
    for message in siem.messages:
        event = message["event"]
        checked(event)
        assert message["app"] == "agent-undo" and message["msgid"] == event["event"]
        assert message["pri"] == (16 * 8 + (5 if event["event"] in sinks.NOTICE else 6))
        assert f'run="{event["run"]}" seq="{event["seq"]}" hash="{event["hash"]}"' in message["sd"]


class WebhookReceiver:
    """A SIEM's HTTPS collector: checks the signature, keeps each batch it is sent, and answers 500 to the
    first (`fail_first`); while `stalled` is set it keeps the batch and does not answer."""

    def __init__(self, secret: str, fail_first: bool = True):
        self.batches, self.refused, self.attempts, self.fail_first = [], [], 0, fail_first
        self.stalled, self.held, self.held_index = threading.Event(), False, -1
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                parts = dict(p.split("=", 1) for p in self.headers[sinks.SIGNATURE_HEADER].split(","))
                expected = hmac.new(secret.encode(), f"{parts['t']}.".encode() + body, hashlib.sha256)
                receiver.attempts += 1
                if not hmac.compare_digest(expected.hexdigest(), parts["v1"]):
                    receiver.refused.append(body)
                    self.send_response(401)
                elif receiver.attempts == 1 and receiver.fail_first:
                    self.send_response(500)
                else:
                    receiver.batches.append(json.loads(body)["events"])
                    if receiver.stalled.is_set():
                        receiver.held, receiver.held_index = True, len(receiver.batches) - 1
                        while receiver.stalled.is_set():
                            time.sleep(0.05)
                        return  # never answered: the sender is gone
                    self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/audit"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def events(self) -> list[dict]:
        return [event for batch in list(self.batches) for event in batch]


def test_a_signed_webhook_sink_is_sent_again_after_a_500_and_the_position_moves_only_once_taken(globex):
    receiver = WebhookReceiver("audit-secret-1")
    streamer = stream.Streamer([sinks.sink_for(receiver.url, secret="audit-secret-1")])
    try:
        pause, failures = streamer.turn(streamer.sinks[0], 0)
        assert (pause, failures) == (1, 1) and not AuditPosition.objects.exists()  # refused: nothing moved
        assert AuditSink.objects.get().last_error.endswith("answered HTTP 500")
        while streamer.turn(streamer.sinks[0], 0) == (0, 0):
            pass
    finally:
        receiver.server.shutdown()
    delivered = [event for batch in receiver.batches for event in batch]
    run = str(globex.public_id)
    assert [e["seq"] for e in delivered if e["run"] == run] == list(range(1, globex.entries.count() + 1))
    assert {e["agent"] for e in delivered} == {"sales-bot"} and receiver.refused == []
    assert AuditPosition.objects.get(run=globex).seq == globex.entries.count()
    for event in delivered:
        checked(event)


def test_the_otlp_sink_sends_each_entry_as_a_log_record_a_siem_can_index(globex):
    collector = Receiver()
    try:
        otlp = sinks.sink_for("otlp", environ={"OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint})
        streamer = stream.Streamer([otlp])
        while streamer.turn(otlp, 0) == (0, 0):
            pass
    finally:
        collector.close()
    entries = list(globex.entries.order_by("seq").values_list("seq", "hash"))
    assert [(r["attributes"]["undo.seq"], r["attributes"]["undo.entry.hash"])
            for r in collector.logs] == entries
    assert {r["attributes"]["undo.run.id"] for r in collector.logs} == {str(globex.public_id)}
    checked(json.loads(collector.logs[0]["body"]))


@pytest.mark.postgres
def test_one_process_streams_to_a_sink_at_a_time_and_a_dead_ones_lease_is_taken_over_at_once():
    now = timezone.now()
    assert stream.claim("syslog+tcp://siem:514", "elsewhere:1:a", now)
    assert not stream.claim("syslog+tcp://siem:514", stream.holder_id(), now)  # another host holds it
    assert stream.claim("syslog+tcp://siem:514", stream.holder_id(), now + stream.timedelta(seconds=31))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    dead = f"{stream.socket.gethostname()}:{gone}:b"
    AuditSink.objects.filter(name="syslog+tcp://siem:514").update(
        holder=dead, held_until=now + stream.timedelta(minutes=5))
    assert stream.claim("syslog+tcp://siem:514", stream.holder_id(), now)  # this host's, and not running


@pytest.mark.parametrize("address, words", [
    ("ftp://siem.example/x", "the audit stream goes to syslog+tcp://"),
    ("syslog+tcp://siem.example", "needs a host and a port"),
    ("https://siem.example/audit", "needs AUDIT_WEBHOOK_SECRET"),
])
def test_a_sink_that_cannot_be_used_stops_the_start_saying_why(settings, address, words):
    settings.AUDIT_STREAM = [address]
    with pytest.raises(ImproperlyConfigured, match=re.escape(words)):
        stream.started()


def test_an_audit_webhook_must_be_https_in_production(settings):
    settings.AUDIT_STREAM, settings.AUDIT_WEBHOOK_SECRET, settings.PRODUCTION = (
        ["http://siem.example/audit"], "s", True)
    with pytest.raises(ImproperlyConfigured, match="must be https in production"):
        stream.started()


def test_every_run_is_in_the_lag_until_delivered(globex):
    count, waited = lag.lag(0, timezone.now())
    assert count == Run.objects.get(pk=globex.pk).head_seq and waited > 0


def test_a_notice_of_rows_no_recorded_call_made_is_streamed_after_the_runs_entries_once(globex):
    """Rows a database's capture kept that no call made belong to no run: the sweep's finding is a notice of
    its own, sent to each sink after the runs' entries, once, named by its id and server (no chain hash:
    it is no entry of a run's record), and counted in the lag until it is delivered."""
    server = ToolServer.objects.first()
    finding = {"rows": 3, "tables": {"public.contacts": 3}, "from": 4, "to": 6,
               "words": "3 rows of public.contacts changed by no recorded call to crm"}
    notice = notices.notify(event="capture_unrecorded", server=server, data=finding, now=timezone.now())
    receiver, siem = WebhookReceiver("audit-secret-1", fail_first=False), SyslogReceiver()
    webhook, syslog = sinks.sink_for(receiver.url, secret="audit-secret-1"), sinks.sink_for(siem.address)
    streamer = stream.Streamer([webhook, syslog])
    try:
        for sink in (webhook, syslog):
            while streamer.turn(sink, 0) == (0, 0):
                pass
            sink_id = AuditSink.objects.get(name=sink.name).pk
            assert lag.lag(sink_id, timezone.now()) == (0, 0.0)
        wait_for(lambda: len(siem.messages) == globex.entries.count() + 1, "the messages")
    finally:
        receiver.server.shutdown()
        syslog.close()
        siem.close()
    delivered = receiver.events()
    assert [e for e in delivered if "notice" in e] == [{
        "notice": notice.pk, "ts": chain.format_ts(notice.at), "event": "capture_unrecorded",
        "data": finding, "server": server.name}]
    assert delivered[-1]["notice"] == notice.pk and len(delivered) == globex.entries.count() + 1
    [line] = [m for m in siem.messages if "notice" in m["event"]]
    assert line["sd"].endswith(f'notice="{notice.pk}" server="{server.name}"]') and line["pri"] == 16 * 8 + 5
    assert {sink.notices_to for sink in AuditSink.objects.all()} == {notice.pk}
    notices.notify(event="capture_unrecorded", server=server, data=finding, now=timezone.now())
    assert lag.lag(AuditSink.objects.first().pk, timezone.now())[0] == 1
