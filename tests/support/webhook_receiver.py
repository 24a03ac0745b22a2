"""Real HTTP receivers of webhooks: one that verifies signatures with ``standardwebhooks``,
and one that accepts connections and never answers."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks import Webhook, WebhookVerificationError


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    path: str
    verified: dict[str, bool]  # secret -> whether its signature verified

    @property
    def id(self) -> str:
        return self.headers["webhook-id"]


@dataclass
class Receiver:
    """Records every request; answers ``status`` (a list is used up first, one per request)."""

    secrets: list[str] = field(default_factory=list)
    status: int = 204
    statuses: list[int] = field(default_factory=list)
    headers_out: dict[str, str] = field(default_factory=dict)
    # Answers for the first requests about one operation: {"op-1": [503]}.
    by_operation: dict[str, list[int]] = field(default_factory=dict)
    # Seconds to hold each request before answering, used up one per request.
    stalls: list[float] = field(default_factory=list)
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: Any = None

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/hooks"

    def verify(self, secret: str, item: Received) -> bool:
        try:
            Webhook(secret).verify(item.body, item.headers)
        except WebhookVerificationError:
            return False
        return True

    def answer(self, item: Received) -> int:
        with self.lock:
            if self.by_operation:
                key = json.loads(item.body)["data"]["operation"]
                if self.by_operation.get(key):
                    return self.by_operation[key].pop(0)
            return self.statuses.pop(0) if self.statuses else self.status

    def stall(self) -> float:
        with self.lock:
            return self.stalls.pop(0) if self.stalls else 0.0


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            headers = {key.lower(): value for key, value in self.headers.items()}
            item = Received(headers, body, self.path, {})
            item.verified = {secret: receiver.verify(secret, item) for secret in receiver.secrets}
            status = receiver.answer(item)
            with receiver.lock:
                receiver.received.append(item)
            time.sleep(receiver.stall())
            self.send_response(status)
            for name, value in receiver.headers_out.items():
                self.send_header(name, value)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


def receiver_serve(receiver: Receiver) -> Iterator[Receiver]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(receiver))
    server.daemon_threads = True
    receiver.server = server
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Silent:
    """A receiver that accepts every connection and never answers: a real listening
    socket whose connections are held open, unread, until it stops. ``accepted`` counts
    them (each is one delivery attempt that can only time out)."""

    accepted: int = 0
    listener: socket.socket | None = None
    held: list[socket.socket] = field(default_factory=list)

    @property
    def url(self) -> str:
        assert self.listener is not None
        host, port = self.listener.getsockname()[:2]
        return f"http://{host}:{port}/hooks"

    def serve(self) -> None:
        assert self.listener is not None
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:  # closed: the receiver stopped
                return
            self.held.append(connection)
            self.accepted += 1


def silent_serve() -> Iterator[Silent]:
    silent = Silent(listener=socket.create_server(("127.0.0.1", 0), backlog=512))
    thread = threading.Thread(target=silent.serve, daemon=True)
    thread.start()
    try:
        yield silent
    finally:
        assert silent.listener is not None
        with contextlib.suppress(OSError):
            silent.listener.shutdown(socket.SHUT_RDWR)
        silent.listener.close()
        for connection in silent.held:
            connection.close()
        thread.join(timeout=5)


@contextlib.contextmanager
def trickling_serve(every: float = 0.2, *, head: bool = False) -> Iterator[str]:
    """A receiver that trickles its answer a byte every ``every`` seconds until it stops:
    each read is quick, the whole answer endless. By default it answers 200 at once and
    trickles its (long) body; ``head``: it sends ``HTTP/1.1 200 OK`` and then trickles a
    header that never ends, so the status is never complete. Yields its URL."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=128)
    stop = threading.Event()
    opening = (
        b"HTTP/1.1 200 OK\r\nX-Trickle: "
        if head
        else (b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")
    )

    def trickle(connection: socket.socket) -> None:
        with connection:
            connection.recv(65536)
            connection.sendall(opening)
            while not stop.wait(every):
                try:
                    connection.sendall(b"a" if head else b".")
                except OSError:  # the client went away
                    return

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:  # closed: the receiver stopped
                return
            threading.Thread(target=trickle, args=(connection,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    host, port = listener.getsockname()[:2]
    try:
        yield f"http://{host}:{port}/hooks"
    finally:
        stop.set()
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join(timeout=5)
