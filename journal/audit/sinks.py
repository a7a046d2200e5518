"""Where the audit stream goes, and each event as it goes there.

An event is one entry of a run's record with what a SIEM needs to check it against the signed record: the
run's public id, the entry's seq, its hash and the hash before it, and the entry itself (its hash is the
SHA-256 of the RFC 8785 bytes of `{seq, ts, event, data, prevHash}`), plus the agent and team it is of.

- `syslog+tcp://host:port`, `syslog+tls://host:port` (RFC 5424 over TCP, octet-counted as RFC 6587 says),
  `syslog+udp://host:port` (one datagram an event; an entry too large for one is sent without its `data`,
  saying so);
- `https://…` (`http://…` outside production): a JSON batch, signed like the product's webhooks
  (`Undo-Audit-Signature: t=…,v1=HMAC-SHA256(AUDIT_WEBHOOK_SECRET, "t.body")`);
- `otlp`: OTLP logs over HTTP, to `OTEL_EXPORTER_OTLP_LOGS_ENDPOINT` (or `OTEL_EXPORTER_OTLP_ENDPOINT`
  + `/v1/logs`), with `OTEL_EXPORTER_OTLP_HEADERS`.

A sink's `send` returns once the whole batch is taken, or raises `NotDelivered`; nothing is counted as
delivered before that.
"""

import hashlib
import hmac
import json
import os
import socket
import ssl
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

SIGNATURE_HEADER = "Undo-Audit-Signature"
TIMEOUT_SECONDS = 10
ENTERPRISE = "undo@32473"  # RFC 5424 structured data: 32473 is the enterprise number kept for examples
NOTICE = frozenset({"approval", "override", "action_decision", "plan_approved", "plan_aborted", "saga",
                    "capture_unrecorded", "committed_later"})
UDP_LIMIT = 60_000
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class NotDelivered(Exception):
    """The sink did not take the batch; `message` says why (it is tried again)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Event:
    """An entry of a run's record, or (`notice` set, no run) a notice of the product's own: rows changed by
    no recorded call (`models.Notice`), with the tool server it is about."""

    run: str
    seq: int
    ts: str
    event: str
    data: Any
    prev_hash: str
    hash: str
    agent: str
    team: str
    notice: int = 0
    server: str = ""

    def as_wire(self) -> dict[str, Any]:
        if self.notice:
            return {"notice": self.notice, "ts": self.ts, "event": self.event, "data": self.data,
                    "server": self.server}
        return {"run": self.run, "seq": self.seq, "ts": self.ts, "event": self.event, "data": self.data,
                "prevHash": self.prev_hash, "hash": self.hash, "agent": self.agent, "team": self.team}

    def identity(self) -> tuple[tuple[str, Any], ...]:
        """What names it for a SIEM to index: an entry its run, seq and hashes; a notice its id."""
        if self.notice:
            return ("notice", self.notice), ("server", self.server)
        return (("run", self.run), ("seq", self.seq), ("hash", self.hash), ("prevHash", self.prev_hash),
                ("agent", self.agent))


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """`t=…,v1=…`: the HMAC-SHA256 of `timestamp.body`, keyed with `secret`."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def shown(address: str) -> str:
    """A sink's address as kept and shown: without credentials or query."""
    if address == "otlp":
        return address
    parts = urlsplit(address)
    return f"{parts.scheme}://{parts.hostname or ''}{f':{parts.port}' if parts.port else ''}{parts.path}"


def sink_for(address: str, *, secret: str = "", production: bool = False, environ=os.environ):
    """The sink `address` names; ValueError (saying why) for one that cannot be used."""
    if address == "otlp":
        return Otlp(environ)
    parts = urlsplit(address)
    if parts.scheme in ("syslog+tcp", "syslog+tls", "syslog+udp"):
        if not parts.hostname or not parts.port:
            raise ValueError(f"{address}: a syslog sink needs a host and a port")
        return Syslog(parts.hostname, parts.port, parts.scheme.removeprefix("syslog+"))
    if parts.scheme in ("https", "http"):
        if parts.scheme == "http" and production:
            raise ValueError(f"{shown(address)}: the audit webhook must be https in production")
        if not secret:
            raise ValueError("an audit webhook needs AUDIT_WEBHOOK_SECRET to sign with")
        return Webhook(address, secret)
    raise ValueError(f"{shown(address)}: the audit stream goes to syslog+tcp://, syslog+tls://, "
                     "syslog+udp://, https:// or otlp")


class Syslog:
    """RFC 5424 messages, octet-counted on a kept TCP (or TLS) connection, or one datagram each."""

    def __init__(self, host: str, port: int, transport: str):
        self.host, self.port, self.transport = host, port, transport
        self.name = f"syslog+{transport}://{host}:{port}"
        self.connection: socket.socket | None = None
        self.hostname = socket.gethostname()[:255] or "-"

    def line(self, event: Event, *, with_data: bool = True) -> bytes:
        severity = 5 if event.event in NOTICE else 6
        wire = event.as_wire() if with_data else {**event.as_wire(), "data": None, "dataOmitted": True}
        params = " ".join(f'{key}="{_sd(value)}"' for key, value in event.identity())
        msgid = "".join(c for c in event.event if 33 <= ord(c) <= 126)[:32] or "-"
        header = f"<{16 * 8 + severity}>1 {event.ts} {self.hostname} agent-undo {os.getpid()} {msgid}"
        return f"{header} [{ENTERPRISE} {params}] ".encode() + json.dumps(wire, separators=(",", ":"),
                                                                          ensure_ascii=False).encode()

    def send(self, events: list[Event]) -> None:
        try:
            if self.transport == "udp":
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                    for event in events:
                        line = self.line(event)
                        sock.sendto(line if len(line) <= UDP_LIMIT else self.line(event, with_data=False),
                                    (self.host, self.port))
                return
            frames = b"".join(b"%d %s" % (len(line), line) for line in map(self.line, events))
            self._connected().sendall(frames)
        except OSError as exc:
            self.close()
            raise NotDelivered(f"{self.name}: {type(exc).__name__}: {exc}") from None

    def _connected(self) -> socket.socket:
        if self.connection is None:
            sock = socket.create_connection((self.host, self.port), timeout=TIMEOUT_SECONDS)
            if self.transport == "tls":
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self.host)
            self.connection = sock
        return self.connection

    def close(self) -> None:
        if self.connection is not None:
            try:
                self.connection.close()
            finally:
                self.connection = None


def _sd(value: Any) -> str:
    """An RFC 5424 structured-data parameter value: `"`, `\\` and `]` escaped."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("]", "\\]")


class Webhook:
    """A JSON batch, `{"events": [...]}`, POSTed and signed; delivered once the receiver answers 2xx."""

    def __init__(self, url: str, secret: str):
        self.url, self.secret, self.name = url, secret, shown(url)

    def send(self, events: list[Event]) -> None:
        body = json.dumps({"events": [event.as_wire() for event in events]}, separators=(",", ":"),
                          ensure_ascii=False).encode()
        signed = signature(self.secret, int(time.time()), body)
        _posted(self.url, self.name, body, {"Content-Type": "application/json",
                                            "User-Agent": "agent-undo-audit/1", SIGNATURE_HEADER: signed})

    def close(self) -> None:
        pass


class Otlp:
    """OTLP logs over HTTP (protobuf): one log record an event, its body the event as JSON, its attributes
    what a SIEM indexes (run, seq, hash, event, agent)."""

    def __init__(self, environ=os.environ):
        self.name = "otlp"
        base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").rstrip("/")
        self.url = environ.get("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT") or (f"{base}/v1/logs" if base else "")
        if not self.url:
            raise ValueError("AUDIT_STREAM=otlp needs OTEL_EXPORTER_OTLP_LOGS_ENDPOINT or "
                             "OTEL_EXPORTER_OTLP_ENDPOINT")
        raw = environ.get("OTEL_EXPORTER_OTLP_LOGS_HEADERS") or environ.get("OTEL_EXPORTER_OTLP_HEADERS", "")
        self.headers = {unquote(k).strip(): unquote(v).strip() for k, _, v in
                        (pair.partition("=") for pair in raw.split(",") if "=" in pair)}
        self.service = environ.get("OTEL_SERVICE_NAME", "agent-undo")

    def send(self, events: list[Event]) -> None:
        records = [LogRecord(
            time_unix_nano=_nanos(event.ts), observed_time_unix_nano=time.time_ns(),
            severity_number=10 if event.event in NOTICE else 9,
            severity_text="NOTICE" if event.event in NOTICE else "INFO",
            body=AnyValue(string_value=json.dumps(event.as_wire(), separators=(",", ":"))),
            attributes=_attributes(event)) for event in events]
        request = ExportLogsServiceRequest(resource_logs=[ResourceLogs(
            resource=Resource(attributes=[_pair("service.name", self.service)]),
            scope_logs=[ScopeLogs(scope=InstrumentationScope(name="agent-undo.audit"),
                                  log_records=records)])])
        _posted(self.url, self.url, request.SerializeToString(),
                {**self.headers, "Content-Type": "application/x-protobuf"})

    def close(self) -> None:
        pass


def _attributes(event: Event) -> list[KeyValue]:
    if event.notice:
        return [_pair("undo.notice.id", event.notice), _pair("undo.server", event.server),
                _pair("undo.event", event.event)]
    return [_pair("undo.run.id", event.run), _pair("undo.seq", event.seq),
            _pair("undo.entry.hash", event.hash), _pair("undo.event", event.event),
            _pair("undo.agent", event.agent)]


def _posted(url: str, name: str, body: bytes, headers: dict) -> None:
    """POST `body`; NotDelivered unless the answer is 2xx (a redirect is not followed)."""
    try:
        answer = httpx.post(url, content=body, headers=headers, timeout=TIMEOUT_SECONDS,
                            follow_redirects=False)
    except httpx.HTTPError as exc:
        raise NotDelivered(f"{name}: {type(exc).__name__}: {exc}") from None
    if not answer.is_success:
        raise NotDelivered(f"{name} answered HTTP {answer.status_code}")


def _pair(key: str, value) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(int_value=value) if isinstance(value, int)
                    else AnyValue(string_value=str(value)))


def _nanos(ts: str) -> int:
    """An entry's timestamp (RFC 3339: `chain.format_ts`) in nanoseconds since the epoch (0 if unreadable)."""
    try:
        moment = datetime.fromisoformat(ts)
    except ValueError:
        return 0
    return (moment - EPOCH) // timedelta(microseconds=1) * 1000
