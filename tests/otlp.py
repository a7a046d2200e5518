"""A real OTLP/HTTP receiver, started by a test: what an OpenTelemetry collector would be sent (traces and
logs, protobuf), kept as plain dicts to read."""

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.conftest import free_port


def _value(any_value):
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def _attributes(pairs) -> dict:
    return {pair.key: _value(pair.value) for pair in pairs}


class Receiver:
    """Spans and log records as they arrive: `spans` (name, ids in hex, kind, attributes, the service's
    name) and `logs` (body, attributes)."""

    def __init__(self):
        self.spans, self.logs = [], []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path == "/v1/traces":
                    receiver.took_traces(body)
                elif self.path == "/v1/logs":
                    receiver.took_logs(body)
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def took_traces(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        with self.lock:
            for resource in request.resource_spans:
                service = _attributes(resource.resource.attributes).get("service.name")
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        self.spans.append({
                            "name": span.name, "trace": span.trace_id.hex(), "id": span.span_id.hex(),
                            "parent": span.parent_span_id.hex(), "kind": span.kind,
                            "attributes": _attributes(span.attributes), "service": service,
                            "error": span.status.code == 2,
                            "links": [link.trace_id.hex() for link in span.links]})

    def took_logs(self, body: bytes) -> None:
        request = ExportLogsServiceRequest.FromString(body)
        with self.lock:
            for resource in request.resource_logs:
                for scope in resource.scope_logs:
                    for record in scope.log_records:
                        self.logs.append({"body": _value(record.body),
                                          "attributes": _attributes(record.attributes)})

    def env(self) -> dict:
        """What a process needs to send here, at once (a short batch delay)."""
        return {"OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100",
                "OTEL_SERVICE_NAME": "agent-undo-test"}

    def close(self) -> None:
        self.server.shutdown()
