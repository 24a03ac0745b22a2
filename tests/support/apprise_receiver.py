"""A real Apprise target: a local HTTP server that keeps every JSON body posted to it,
for ``json://127.0.0.1:PORT/`` URLs (alerts, approval notices)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    """Keeps each post (its JSON body, its path as ``_path``); answers ``status``.

    A post answered with an error status is not kept: it was not taken.
    """

    def __init__(self) -> None:
        self.posts: list[dict[str, Any]] = []
        self.status = 200
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length))
                with receiver.lock:
                    status = receiver.status
                    if status < 400:
                        receiver.posts.append({**body, "_path": self.path})
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"json://127.0.0.1:{self.port}/alerts"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def take(self) -> list[dict[str, Any]]:
        """The posts received since the last take, without their paths."""
        with self.lock:
            taken = [{k: v for k, v in post.items() if k != "_path"} for post in self.posts]
            self.posts.clear()
        return taken

    def take_by_path(self) -> list[tuple[str, dict[str, Any]]]:
        """The posts received since the last take, each with the path it was posted to."""
        with self.lock:
            taken = [
                (post["_path"], {k: v for k, v in post.items() if k != "_path"})
                for post in self.posts
            ]
            self.posts.clear()
        return taken

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def receiver_serve() -> Iterator[Receiver]:
    """A fixture's body: a receiver for the test, closed after it."""
    server = Receiver()
    yield server
    server.close()
