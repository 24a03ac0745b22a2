"""The baselines ``bench/client.py`` holds the library to: the lifecycle written by hand.

``httpx`` is what a host engineer would write without the library; ``sockets`` is the
same on plain sockets, so that what any HTTP client costs here is not hidden. Both record
one ``calls`` entry per lifecycle (``<role> run``) and count their requests.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from harness import providers
from harness.fleet.api import REQUEST_TIMEOUT
from harness.fleet.client import PARAMS, Client, iterations, opening_body

Post = Callable[[str, str, dict[str, Any], int], dict[str, Any]]


def role_httpx(client: Client) -> None:
    """``lifecycle`` written by hand on ``httpx``, as a host engineer would without the library.

    The baseline ``bench/client.py`` holds the library to: the same four requests on the
    same HTTP client the library uses (one ``httpx.Client`` per credential, its
    connections reused when the server keeps them), the digest computed per run, every
    answer's status checked and the fields the next request needs read from it. No
    heartbeat: the effect does nothing, as in ``library``.
    """
    import httpx

    http = {
        caller: httpx.Client(base_url=client.api.url, headers={"Authorization": f"Bearer {token}"})
        for caller, token in client.api.tokens.items()
    }

    def post(caller: str, path: str, body: dict[str, Any], status: int) -> dict[str, Any]:
        client.requests += 1
        response = http[caller].post(path, json=body)
        answer: dict[str, Any] = response.json()
        if response.status_code != status:
            raise RuntimeError(f"{path}: HTTP {response.status_code} {answer}")
        return answer

    _lifecycles(client, "httpx run", post, httpx.HTTPError, digest_checked=True)


def _socket_sender(client: Client) -> Callable[[str, str, dict[str, Any]], tuple[int, Any]]:
    """A POST on a fresh socket, closed by the server after it (gunicorn's sync workers
    close every connection anyway): ``(status, JSON body)``, no HTTP library at all."""
    parts = urllib.parse.urlsplit(client.api.url)
    address = (parts.hostname or "127.0.0.1", parts.port or 80)

    def send(caller: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        client.requests += 1
        raw = json.dumps(body).encode("utf-8")
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {address[0]}:{address[1]}\r\n"
            f"Authorization: Bearer {client.api.tokens[caller]}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n"
            "Connection: close\r\n\r\n"
        )
        with socket.create_connection(address, timeout=REQUEST_TIMEOUT) as sock:
            sock.sendall(head.encode("latin-1") + raw)
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        status_line, _, rest = b"".join(chunks).partition(b"\r\n")
        return int(status_line.split(b" ")[1]), json.loads(rest.partition(b"\r\n\r\n")[2])

    return send


def role_sockets(client: Client) -> None:
    """``lifecycle`` written by hand on plain sockets: what any HTTP client costs, shown.

    The floor ``bench/client.py`` reports beside ``httpx`` and the library: the same four
    requests, each on a fresh connection, the status line checked and the JSON body
    read. No heartbeat: the effect does nothing, as in ``library``.
    """
    send = _socket_sender(client)

    def post(caller: str, path: str, body: dict[str, Any], status: int) -> dict[str, Any]:
        answered, answer = send(caller, path, body)
        if answered != status:
            raise RuntimeError(f"{path}: HTTP {answered} {answer}")
        return dict(answer)

    _lifecycles(client, "sockets run", post, OSError, digest_checked=False)


def role_lifecycle_sockets(client: Client) -> None:
    """``lifecycle``'s requests on plain sockets, each recorded as ``lifecycle`` records it.

    The load generator ``bench/api.py --client sockets`` runs: register and open the
    approval in one request (and dispatch, where a policy approves it as it opens), else
    approve and dispatch; report committed. The client as cheap as the hand-written one
    of the checkouts ``bench/api_pairs.py`` compares with, so that a ratio of rates is
    the servers' and not their clients'. Each request is one ``calls`` entry (endpoint,
    status, code, ms); any answer but the lifecycle's next is ``unexpected``.
    """
    send = _socket_sender(client)
    digest = providers.digest_of(PARAMS)
    provider = client.providers[0]

    def call(endpoint: str, caller: str, path: str, body: dict[str, Any], key: str) -> Any:
        started = time.perf_counter()
        try:
            status, answer = send(caller, path, body)
        except (OSError, ValueError, IndexError) as exc:  # no answer, or not HTTP and JSON
            status, answer = 0, {"error": f"transport:{type(exc).__name__}"}
        elapsed_ms = (time.perf_counter() - started) * 1000
        code = "" if 200 <= status < 300 else str(answer.get("error", "malformed"))
        client.api.calls.append([endpoint, status, code, elapsed_ms, None, None])
        if code:
            client.api.unexpected.append(
                {"endpoint": endpoint, "key": key, "outcome": f"{status}:{code}", "body": answer}
            )
            return None
        return answer

    for i in iterations(client):
        key = f"{client.name}-{i}"
        body = opening_body(key, provider, client.name)
        registered = call("register and open", "host", "/api/v1/operations", body, key)
        if registered is None:
            continue
        held = registered.get("dispatch")
        if isinstance(held, dict):  # a policy approved it as it opened: dispatched too
            client.api.calls[-1][0] = "register, open and dispatch"
        else:  # a person approves: then the host dispatches
            decision = {"decision": "approve", "ttl_seconds": 300, "params_digest": digest}
            path = f"/api/v1/approvals/{registered['approval']['approval_id']}/decision"
            dispatch = {"worker": client.name, "params_digest": digest}
            if call("approve", "approver", path, decision, key) is None:
                continue
            held = call("dispatch", "host", f"/api/v1/operations/{key}/dispatch", dispatch, key)
            if held is None:
                continue
        result = {"fencing_token": held["fencing_token"], "outcome": "committed"}
        reported = call("report committed", "host", f"/api/v1/operations/{key}/result", result, key)
        if reported is not None and reported.get("state") == "released":
            client.lifecycles += 1


def _lifecycles(
    client: Client,
    endpoint: str,
    post: Post,
    transport_error: type[Exception],
    *,
    digest_checked: bool,
) -> None:
    """The four requests of a lifecycle through ``post``, one ``calls`` entry per run.

    ``digest_checked``: whether the run compares Settle's params digest with its own, as
    the library does (the httpx baseline does; the sockets floor does not).
    """
    provider = client.providers[0]
    for i in iterations(client):
        key = f"{client.name}-{i}"
        operation = f"/api/v1/operations/{key}"
        started = time.perf_counter()
        try:
            digest = providers.digest_of(PARAMS)
            body = {"key": key, "action": "payment.send", "provider": provider.name}
            registered = post(
                "host", "/api/v1/operations", {**body, "params": PARAMS, "approval": {}}, 201
            )
            if digest_checked and registered["params_digest"] != digest:
                raise RuntimeError(f"Settle digests the params as {registered['params_digest']}")
            opened = registered["approval"]
            post(
                "approver",
                f"/api/v1/approvals/{opened['approval_id']}/decision",
                {"decision": "approve", "ttl_seconds": 300, "params_digest": digest},
                200,
            )
            dispatch = {"worker": client.name, "params_digest": digest}
            held = post("host", f"{operation}/dispatch", dispatch, 200)
            reported = post(
                "host",
                f"{operation}/result",
                {"fencing_token": held["fencing_token"], "outcome": "committed"},
                200,
            )
        except (RuntimeError, KeyError, ValueError, transport_error) as exc:
            client.api.unexpected.append({"endpoint": endpoint, "key": key, "error": repr(exc)})
            continue
        elapsed_ms = (time.perf_counter() - started) * 1000
        client.api.calls.append([endpoint, 200, "", elapsed_ms, None, None])
        if reported.get("state") == "released":
            client.lifecycles += 1
        else:
            client.api.unexpected.append({"endpoint": endpoint, "key": key, "body": reported})
