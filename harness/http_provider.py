"""A small HTTP provider that performs effects and answers signed lookups (tests only).

Run: ``python harness/http_provider.py --port PORT --secret SECRET --store FILE``.
Prints ``ready`` on stdout once listening on 127.0.0.1. Standard library only, so it runs
as a plain script without the project on ``sys.path``.

* ``POST /effects/{key}`` with ``{"params_digest", "reference", "status"}`` performs an
  effect: it gets the next ``seq`` and a ``committed_at`` and replaces any earlier record
  for the key (the provider itself is not idempotent; see ``/history``). Answers 201.
* ``GET /effects/{key}`` answers 200 with the record and ``X-Provider-Signature`` (hex
  HMAC-SHA256 of the raw body with the secret), or 404.
* ``GET /history/{key}`` lists every effect performed for the key, oldest first.
* ``POST /control`` with ``{"mode": ..., "delay": seconds?}`` changes how ``GET /effects``
  answers: ``normal``, ``bad_signature``, ``no_signature``, ``error_500``, ``slow`` (sleep
  ``delay``, default 10 s, then answer normally), ``unparsable_body`` (signed non-JSON),
  ``wrong_key`` (signed record naming another key), ``teapot`` (HTTP 418).

Effects live in the ``--store`` JSON file, replaced atomically on every change, so a
restarted server keeps them. The mode lives in memory and starts as ``normal``.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import sys
import tempfile
import threading
import time
import urllib.parse
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MODES = frozenset(
    {
        "normal",
        "bad_signature",
        "no_signature",
        "error_500",
        "slow",
        "unparsable_body",
        "wrong_key",
        "teapot",
    }
)
MAX_BODY = 64 * 1024


class Store:
    """Effects in a JSON file; every change is written to a temp file, fsynced, replaced."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        if path.exists():
            self.data: dict[str, Any] = json.loads(path.read_text("utf-8"))
        else:
            self.data = {"last_seq": 0, "effects": {}, "history": []}

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name + ".")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(self.data, handle, sort_keys=True)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    def perform(self, key: str, params_digest: str, reference: str, status: str) -> dict[str, Any]:
        with self.lock:
            seq = int(self.data["last_seq"]) + 1
            record = {
                "seq": seq,
                "operation_key": key,
                "params_digest": params_digest,
                "reference": reference,
                "status": status,
                "committed_at": datetime.now(UTC).isoformat(),
            }
            self.data["last_seq"] = seq
            self.data["effects"][key] = record
            self.data["history"].append(record)
            self._save()
            return dict(record)

    def get(self, key: str) -> dict[str, Any] | None:
        with self.lock:
            record = self.data["effects"].get(key)
            return None if record is None else dict(record)

    def history(self, key: str) -> list[dict[str, Any]]:
        with self.lock:
            return [dict(r) for r in self.data["history"] if r["operation_key"] == key]


class State:
    def __init__(self, store: Store, secret: str) -> None:
        self.store = store
        self.secret = secret.encode("utf-8")
        self.mode = "normal"
        self.delay = 10.0
        self.lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    server: ProviderServer
    protocol_version = "HTTP/1.1"

    # ------------------------------------------------------------------ plumbing

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write(f"{self.address_string()} {format % args}\n")

    def _send(self, code: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (e.g. timed out during "slow")

    def _send_json(self, code: int, value: Any) -> None:
        self._send(code, json.dumps(value, sort_keys=True).encode("utf-8"))

    def _read_json(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise ValueError("body too large")
        return json.loads(self.rfile.read(length) or b"null")

    def _route(self) -> tuple[str, str]:
        path = urllib.parse.urlsplit(self.path).path
        for prefix in ("/effects/", "/history/"):
            if path.startswith(prefix) and len(path) > len(prefix):
                return prefix.strip("/"), urllib.parse.unquote(path[len(prefix) :])
        return path, ""

    # ------------------------------------------------------------------ handlers

    def do_GET(self) -> None:
        route, key = self._route()
        state = self.server.state
        if route == "history":
            self._send_json(200, state.store.history(key))
            return
        if route != "effects":
            self._send_json(404, {"error": "not found"})
            return
        with state.lock:
            mode, delay = state.mode, state.delay
        if mode == "slow":
            time.sleep(delay)
        if mode == "error_500":
            self._send_json(500, {"error": "internal error"})
            return
        if mode == "teapot":
            self._send_json(418, {"error": "I'm a teapot"})
            return
        record = state.store.get(key)
        if record is None:
            self._send_json(404, {"error": "no effect for this key"})
            return
        if mode == "wrong_key":
            record["operation_key"] = key + "-other"
        body = json.dumps(record, sort_keys=True).encode("utf-8")
        if mode == "unparsable_body":
            body = b'{"operation_key": ' + json.dumps(key).encode("utf-8") + b", oops"
        signature = hmac.new(state.secret, body, hashlib.sha256).hexdigest()
        headers: dict[str, str] = {}
        if mode == "bad_signature":
            headers["X-Provider-Signature"] = hmac.new(
                b"not-the-secret", body, hashlib.sha256
            ).hexdigest()
        elif mode != "no_signature":
            headers["X-Provider-Signature"] = signature
        self._send(200, body, headers)

    def do_POST(self) -> None:
        route, key = self._route()
        state = self.server.state
        try:
            payload = self._read_json()
        except ValueError as exc:
            self._send_json(400, {"error": f"bad JSON body: {exc}"})
            return
        if route == "/control":
            mode = payload.get("mode") if isinstance(payload, dict) else None
            delay = payload.get("delay", 10.0) if isinstance(payload, dict) else None
            if mode not in MODES or not isinstance(delay, int | float):
                self._send_json(400, {"error": f"mode must be one of {sorted(MODES)}"})
                return
            with state.lock:
                state.mode, state.delay = mode, float(delay)
            self._send_json(200, {"mode": mode, "delay": float(delay)})
            return
        if route != "effects":
            self._send_json(404, {"error": "not found"})
            return
        if not isinstance(payload, dict):
            self._send_json(400, {"error": "body must be a JSON object"})
            return
        params_digest = payload.get("params_digest")
        reference = payload.get("reference")
        status = payload.get("status", "committed")
        if not (
            isinstance(params_digest, str)
            and isinstance(reference, str)
            and isinstance(status, str)
        ):
            self._send_json(400, {"error": "params_digest, reference and status must be text"})
            return
        record = state.store.perform(key, params_digest, reference, status)
        self._send_json(201, record)


class ProviderServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], state: State) -> None:
        self.state = state
        super().__init__(address, Handler)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--secret", required=True)
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args(argv)
    state = State(Store(args.store), args.secret)
    server = ProviderServer((args.host, args.port), state)
    print("ready", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
