"""A SIEM's syslog listener, started by a test: RFC 5424 messages over TCP, octet-counted (RFC 6587), each
parsed into its header, its structured data and its JSON message. It can be made slow, to keep the audit
stream behind."""

import json
import re
import socket
import threading
import time

from tests.conftest import free_port

_LINE = re.compile(rb"<(\d+)>1 (\S+) (\S+) (\S+) (\S+) (\S+) (\[.*?[^\\]\]) (.*)", re.S)


class SyslogReceiver:
    def __init__(self, delay: float = 0.0):
        self.delay, self.messages, self.lock = delay, [], threading.Lock()
        self.server = socket.create_server(("127.0.0.1", free_port()))
        self.port = self.server.getsockname()[1]
        self.address = f"syslog+tcp://127.0.0.1:{self.port}"
        self.open = True
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while self.open:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._read, args=(connection,), daemon=True).start()

    def _read(self, connection: socket.socket) -> None:
        buffer = b""
        with connection:
            while True:
                chunk = connection.recv(65536)
                if not chunk:
                    return
                buffer += chunk
                while b" " in buffer:
                    length, _, rest = buffer.partition(b" ")
                    if len(rest) < int(length):
                        break
                    frame, buffer = rest[:int(length)], rest[int(length):]
                    self._took(frame)

    def _took(self, frame: bytes) -> None:
        match = _LINE.fullmatch(frame)
        assert match, frame[:200]
        pri, ts, host, app, pid, msgid, data, message = match.groups()
        with self.lock:
            self.messages.append({"pri": int(pri), "ts": ts.decode(), "app": app.decode(),
                                  "msgid": msgid.decode(), "sd": data.decode(), "event": json.loads(message)})
        if self.delay:
            time.sleep(self.delay)

    def events(self) -> list[dict]:
        with self.lock:
            return [message["event"] for message in self.messages]

    def close(self) -> None:
        self.open = False
        self.server.close()
