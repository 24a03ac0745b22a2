"""Fleet clients: OS processes that drive Settle's host API over HTTP for a bounded time.

Used by ``bench/api.py`` (role ``lifecycle``) and ``tests/integration/test_fleet_soak.py``
(the mixed roles) through :func:`fleet_run`, which starts the processes, releases them
together and collects what each wrote. A client runs as::

    python tests/procs/fleet.py --url URL --name NAME --role ROLE --seconds S \\
        --go-file FILE --out FILE [--providers JSON] [--shared-dir DIR] [--index N]

with the host token in ``SETTLE_HOST_TOKEN`` and the approver token in
``SETTLE_APPROVER_TOKEN``. It prints ``ready`` (a JSON line, see ``tests/procs/worker.py``),
waits for the go file, then loops until ``--seconds`` after the go file appeared, with a
fresh connection per request (gunicorn's sync workers close every connection anyway) and
standard library only, apart from the provider "outside tools" in
``tests/support/providers.py`` and ``httpx`` for roles ``httpx`` and ``library``. Its CPU
is counted from the first iteration of its loop (``cpu`` in the ``--out`` file), so that
a role's set-up is not charged to its requests.

Roles (``--providers`` is a JSON list of ``{kind, name, path, url, secret, lease_seconds}``):

``lifecycle``
    register and open the approval (one request) → approve → dispatch → report
    committed, unique keys, on the first provider, no effect performed: the benchmark's
    loop.
``httpx``
    The same lifecycle written by hand on ``httpx.Client``, as a host engineer would
    without the library: the baseline ``bench/client.py`` holds the library to.
``library``
    The same lifecycle through ``settle_client.Host.run`` (``bench/client.py`` sets it
    against ``httpx`` and ``lifecycle`` in one run).
``steady``
    The same on each provider in turn, performing the effect at the provider, with a
    heartbeat; some report ``failed``, some are revoked before dispatch (which is then
    refused as ``revoked``), some after dispatch (``revoked: false``).
``racer``
    All racers drive the same key per time slot (``race-<n>``) on the first provider:
    register, open, approve, then dispatch or resume; the one that gets the fencing token
    performs the effect and reports. Racer 0 revokes every fifth key first; racer 1
    presents forged fencing tokens.
``crasher``
    Dispatches on the first provider (meant to have a 1 s lease) and "crashes": stops
    after the effect, or before it, or reports only after its lease lapsed, or resumes
    its own lapsed operation later as a fresh worker, polling until it is released.
    Crashed keys are published in ``--shared-dir`` for the resumer.
``callbacker``
    Dispatches on the first provider (an HTTP provider with a secret), performs the
    effect there and sends the provider's signed callbacks: matching, after a report,
    mismatching then matching, stale sequences, a wrong signature, a record of failure.
``resumer``
    Resumes the keys the crashers and callbackers published, once their lease has
    lapsed, and polls each while Settle answers ``in_progress`` (a background worker
    runs the lookup that resume queued), then resumes a released one once more.

Only ``library`` uses ``settle_client``: the other roles are the soak test's judges of
the server, one request at a time (each answer checked against what the role expects
there, forged tokens, lapsed leases on purpose), with resumes of many keys interleaved
in one process (``run_due``), which a blocking ``Host.run`` per key cannot do.

Resume never looks a provider up inside the request: after a lapsed lease it queues a
lookup for a Celery worker and answers ``in_progress`` with ``retry_after``. A client
that wants the outcome polls (``Client.resume_polled``): it waits ``retry_after``, at
most ``RESUME_WAIT`` seconds at a time, and asks at most ``RESUME_POLLS`` times; an
operation still ``in_progress`` after that is unexpected (no lookup ran).

Every answer is checked against what the role expects at that point; anything else is
listed under ``unexpected``. A 5xx, a body that is not a JSON object and a transport error
are never expected. The ``--out`` file (JSON, written at the end) holds every call as
``[endpoint, status, code, milliseconds, sql, transactions, cpu_ms]``
(``sql``/``transactions``/``cpu_ms`` from the ``X-Settle-SQL`` headers of
``bench/counting_wsgi.py``, else null), the fencing
tokens each key was handed, each key's provider and intended ending, ``resumes`` (how
many resumes were answered with each decision) and ``violations`` (a second effect
performed for one key).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import hmac
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tests.procs.worker import emit, wait_for_file  # noqa: E402
from tests.support import providers  # noqa: E402

FLEET_SCRIPT = Path(__file__).resolve()
SQL_HEADER = "X-Settle-SQL"
SQL_DETAIL_HEADER = "X-Settle-SQL-Detail"
PARAMS = {"amount": 1250, "currency": "EUR", "to": "acct-7", "memo": "fleet"}
OTHER_PARAMS = {**PARAMS, "amount": 9999}
RACE_SLOT_SECONDS = 0.4
REQUEST_TIMEOUT = 20.0
# A resumer's poll while its operation is in_progress: retry_after, capped (a live 60 s
# lease need not be waited out here), at most this many times.
RESUME_WAIT = 1.0
RESUME_POLLS = 12


# -- one HTTP call, measured and judged -------------------------------------------------


@dataclass(frozen=True)
class Answer:
    status: int  # 0: no HTTP answer at all (transport error)
    code: str  # "" for 2xx; the error code, or "malformed" / "transport:<Exception>"
    body: dict[str, Any]

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def outcome(self) -> str:
        """``"200"`` for a success, ``"409:already_consumed"`` for an error."""
        return str(self.status) if self.ok else f"{self.status}:{self.code}"


class Api:
    """The host API over HTTP; every call is recorded and judged."""

    def __init__(self, url: str, host_token: str, approver_token: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.tokens = {"host": host_token, "approver": approver_token, "": ""}
        self.calls: list[list[Any]] = []
        self.unexpected: list[dict[str, Any]] = []

    def _send(
        self, method: str, path: str, raw: bytes | None, headers: dict[str, str]
    ) -> tuple[int, bytes, str | None, str | None]:
        """One HTTP/1.1 exchange on a fresh connection, which the server closes after it.

        Written on a plain socket rather than ``http.client`` (whose header parsing
        alone cost about as much CPU as the rest of a call): the clients share the
        benchmark's machine with the server, and what they spend is not the server's.
        """
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        lines += [f"Content-Length: {len(raw or b'')}", "Connection: close", "", ""]
        request = "\r\n".join(lines).encode("latin-1") + (raw or b"")
        with socket.create_connection((self.host, self.port), timeout=REQUEST_TIMEOUT) as sock:
            sock.sendall(request)
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return _http_response(b"".join(chunks))

    def call(
        self,
        endpoint: str,
        path: str,
        body: Any = None,
        *,
        expect: Iterable[str],
        key: str = "",
        auth: str = "host",
        method: str = "POST",
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Answer:
        """Send one request; record ``[endpoint, status, code, ms, sql, tx, cpu_ms]``.

        ``expect`` lists the outcomes this call may have here (``Answer.outcome``); any
        other is recorded in ``unexpected``, and a 5xx or transport error always is.
        """
        if raw is None and method == "POST":
            raw = json.dumps({} if body is None else body).encode("utf-8")
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        if self.tokens[auth]:
            all_headers["Authorization"] = f"Bearer {self.tokens[auth]}"
        sql: int | None = None
        transactions: int | None = None
        cpu_ms: float | None = None
        started = time.perf_counter()
        try:
            status, data, sql_header, detail = self._send(method, path, raw, all_headers)
        except OSError as exc:  # ConnectionError too: no whole HTTP answer
            answer = Answer(0, f"transport:{type(exc).__name__}", {"message": str(exc)})
        else:
            answer = _parse_answer(status, data)
            if sql_header is not None:
                sql = int(sql_header)
                transactions = _detail_number(detail, "begin")
                cpu_us = _detail_number(detail, "cpu_us")
                cpu_ms = cpu_us / 1000 if cpu_us is not None else None
        elapsed_ms = (time.perf_counter() - started) * 1000
        self.calls.append(
            [endpoint, answer.status, answer.code, elapsed_ms, sql, transactions, cpu_ms]
        )
        allowed = set(expect)
        if answer.outcome not in allowed or answer.status >= 500 or answer.status == 0:
            self.unexpected.append(
                {
                    "endpoint": endpoint,
                    "key": key,
                    "outcome": answer.outcome,
                    "expected": sorted(allowed),
                    "body": answer.body,
                    "at": time.time(),
                }
            )
        return answer

    def check(self, answer: Answer, endpoint: str, key: str, **fields: Any) -> None:
        """A 2xx answer whose body lacks one of ``fields`` (name=value) is unexpected too."""
        wrong = {name: answer.body.get(name) for name, value in fields.items()}
        if answer.ok and wrong != fields:
            self.unexpected.append(
                {
                    "endpoint": endpoint,
                    "key": key,
                    "outcome": f"{answer.status} with {wrong}",
                    "expected": [str(fields)],
                    "body": answer.body,
                }
            )


def _http_response(data: bytes) -> tuple[int, bytes, str | None, str | None]:
    """``(status, body, X-Settle-SQL, X-Settle-SQL-Detail)`` of a whole HTTP/1.1 response.

    A response cut short or not HTTP raises ``ConnectionError`` (a transport error).
    """
    head, separator, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    parts = status_line.split(" ", 2)
    if (
        not separator
        or len(parts) < 2
        or not parts[0].startswith("HTTP/")
        or not parts[1].isdigit()
    ):
        raise ConnectionError(f"not a whole HTTP response: {data[:80]!r}")
    fields = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip()
    # Every API answer has a length (no chunked answers): less is a cut-short response.
    length = fields.get("content-length", "")
    if not length.isdigit() or len(body) < int(length):
        raise ConnectionError(f"no whole body of {length or 'unknown'} bytes")
    body = body[: int(length)]
    return (
        int(parts[1]),
        body,
        fields.get(SQL_HEADER.lower()),
        fields.get(SQL_DETAIL_HEADER.lower()),
    )


def _parse_answer(status: int, data: bytes) -> Answer:
    try:
        body = json.loads(data)
    except ValueError:
        return Answer(status, "malformed", {"raw": data[:300].decode("utf-8", "replace")})
    if not isinstance(body, dict):
        return Answer(status, "malformed", {"raw": body})
    if 200 <= status < 300:
        return Answer(status, "", body)
    code = body.get("error")
    return Answer(status, code if isinstance(code, str) else "malformed", body)


def _detail_number(detail: str | None, wanted: str) -> int | None:
    for part in (detail or "").split():
        name, _, value = part.partition("=")
        if name == wanted:
            return int(value)
    return None


# -- the host API, one method per endpoint ------------------------------------------------


@dataclass
class Provider:
    """A provider as a client sees it: where to perform effects, and its lease."""

    name: str
    kind: str
    lease_seconds: int = 60
    path: str = ""  # sqlite, journal
    url: str = ""  # http
    secret: str = ""  # http: signs callbacks

    @property
    def short_lease(self) -> bool:
        return self.lease_seconds <= 2


@dataclass
class Client:
    """One fleet client: its API, its record of keys, tokens and violations."""

    api: Api
    name: str
    index: int
    providers: list[Provider]
    shared_dir: Path | None
    deadline: float = 0.0
    t0: float = 0.0
    lifecycles: int = 0
    requests: int = 0  # HTTP requests made through httpx (roles httpx, library)
    tokens: Counter[str] = field(default_factory=Counter)
    keys: dict[str, dict[str, str]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    resumes: Counter[str] = field(default_factory=Counter)  # decision: answers
    later: list[tuple[float, str, Any]] = field(default_factory=list)
    cpu_started: float = 0.0  # process_time() when the role's loop began

    # endpoints ---------------------------------------------------------------------

    def register(
        self, key: str, provider: Provider, expect: Iterable[str] = ("201",), params: Any = None
    ) -> Answer:
        self.keys.setdefault(key, {"provider": provider.name, "intent": "aborted"})
        body = {
            "key": key,
            "action": "payment.send",
            "provider": provider.name,
            "params": PARAMS if params is None else params,
        }
        return self.api.call("register", "/api/v1/operations", body, expect=expect, key=key)

    def open_approval(self, key: str, expect: Iterable[str] = ("201",)) -> Answer:
        path = f"/api/v1/operations/{key}/approvals"
        return self.api.call("open approval", path, expect=expect, key=key)

    def approve(self, key: str, approval_id: str, expect: Iterable[str] = ("200",)) -> Answer:
        return self.api.call(
            "approve",
            f"/api/v1/approvals/{approval_id}/decision",
            # The approver's app shows the action and names the digest it showed.
            {
                "decision": "approve",
                "ttl_seconds": 300,
                "params_digest": providers.digest_of(PARAMS),
            },
            expect=expect,
            key=key,
            auth="approver",
        )

    def dispatch(self, key: str, expect: Iterable[str] = ("200",)) -> str:
        """The fencing token handed out, or ""."""
        answer = self.api.call(
            "dispatch",
            f"/api/v1/operations/{key}/dispatch",
            {"worker": self.name, "params_digest": providers.digest_of(PARAMS)},
            expect=expect,
            key=key,
        )
        token = answer.body.get("fencing_token", "") if answer.ok else ""
        if token:
            self.tokens[key] += 1
        return str(token)

    def resume(self, key: str, decisions: Iterable[str]) -> tuple[str, str, float]:
        """``(decision, fencing token or "", retry_after or 0)``.

        A decision not in ``decisions`` is unexpected, and so is ``in_progress`` without
        ``retry_after`` (a live lease, or a lookup queued or running, always says when to
        ask again).
        """
        answer = self.api.call(
            "resume",
            f"/api/v1/operations/{key}/resume",
            {"worker": self.name},
            expect=("200",),
            key=key,
        )
        if not answer.ok:
            return "", "", 0.0
        decision, token = (
            str(answer.body.get("decision")),
            str(answer.body.get("fencing_token", "")),
        )
        retry_after = float(answer.body.get("retry_after") or 0)
        self.resumes[decision] += 1
        if token:
            self.tokens[key] += 1
        if (
            decision not in set(decisions)
            or bool(token) != (decision == "dispatch")
            or (decision == "in_progress" and retry_after < 1)
        ):
            self.api.unexpected.append(
                {
                    "endpoint": "resume",
                    "key": key,
                    "outcome": f"200 decision {decision}",
                    "expected": sorted(decisions),
                    "body": answer.body,
                }
            )
        return decision, token, retry_after

    def resume_polled(
        self,
        key: str,
        decisions: Iterable[str],
        then: Callable[[str], None],
        polls: int = RESUME_POLLS,
    ) -> None:
        """Resume ``key``; while ``in_progress``, ask again after ``retry_after`` (deferred,
        see ``run_due``), ``polls`` times at most; then ``then(last decision)``.

        A decision still ``in_progress`` after the last poll is unexpected: nothing ran
        the lookup that resume queued, or the lease never ended.
        """
        decisions = tuple(decisions)
        decision, _, retry_after = self.resume(key, decisions)
        if decision == "in_progress" and polls > 1:
            wait = min(max(retry_after, 0.1), RESUME_WAIT)
            self.later.append(
                (
                    time.monotonic() + wait,
                    key,
                    lambda: self.resume_polled(key, decisions, then, polls - 1),
                )
            )
            return
        if decision == "in_progress":
            self.api.unexpected.append(
                {
                    "endpoint": "resume",
                    "key": key,
                    "outcome": f"still in_progress after {RESUME_POLLS} polls",
                    "at": time.time(),
                }
            )
        then(decision)

    def heartbeat(self, key: str, token: str, expect: Iterable[str] = ("200",)) -> Answer:
        path = f"/api/v1/operations/{key}/heartbeat"
        return self.api.call("heartbeat", path, {"fencing_token": token}, expect=expect, key=key)

    def report(
        self, key: str, token: str, outcome: str = "committed", expect: Iterable[str] = ("200",)
    ) -> Answer:
        return self.api.call(
            f"report {outcome}",
            f"/api/v1/operations/{key}/result",
            {"fencing_token": token, "outcome": outcome, "provider_reference": f"ref-{key}"},
            expect=expect,
            key=key,
        )

    def revoke(self, key: str, permit_id: str) -> Answer:
        return self.api.call(
            "revoke",
            f"/api/v1/permits/{permit_id}/revoke",
            {"reason": f"{self.name} changed its mind"},
            expect=("200",),
            key=key,
        )

    def record(self, key: str) -> dict[str, Any]:
        path = f"/api/v1/operations/{key}"
        answer = self.api.call("record", path, method="GET", expect=("200",), key=key)
        return answer.body if answer.ok else {}

    def callback(
        self,
        key: str,
        provider: Provider,
        payload: dict[str, Any],
        expect: Iterable[str] = ("200",),
        secret: str = "",
    ) -> Answer:
        raw = json.dumps(payload).encode("utf-8")
        signature = hmac.new(
            (secret or provider.secret).encode("utf-8"), raw, hashlib.sha256
        ).hexdigest()
        return self.api.call(
            "callback",
            f"/api/v1/providers/{provider.name}/callbacks",
            raw=raw,
            expect=expect,
            key=key,
            auth="",
            headers={"X-Provider-Signature": signature},
        )

    # steps -------------------------------------------------------------------------

    def approved(self, key: str, provider: Provider) -> str:
        """Register, open and approve a fresh key; the permit id, or "" if a step failed."""
        if not self.register(key, provider).ok:
            return ""
        opened = self.open_approval(key)
        if not opened.ok:
            return ""
        if opened.body.get("status") == "approved":  # a policy approved it as it opened
            return str(opened.body.get("permit_id") or "")
        decided = self.approve(key, str(opened.body.get("approval_id")))
        return str(decided.body.get("permit_id") or "") if decided.ok else ""

    def registered_and_approved(self, key: str, provider: Provider) -> str:
        """``approved`` with the approval opened by the registration (one request fewer)."""
        self.keys.setdefault(key, {"provider": provider.name, "intent": "aborted"})
        body = {
            "key": key,
            "action": "payment.send",
            "provider": provider.name,
            "params": PARAMS,
            "approval": {},
        }
        registered = self.api.call(
            "register and open", "/api/v1/operations", body, expect=("201",), key=key
        )
        opened = registered.body.get("approval") if registered.ok else None
        if not isinstance(opened, dict):
            return ""
        if opened.get("status") == "approved":  # a policy approved it as it opened
            return str(opened.get("permit_id") or "")
        decided = self.approve(key, str(opened.get("approval_id")))
        return str(decided.body.get("permit_id") or "") if decided.ok else ""

    def perform(self, key: str, provider: Provider, status: str = "committed") -> int:
        """Perform the effect at the provider (as its outside tool does); the record's seq."""
        try:
            stored = providers.provider_perform(
                provider.kind,
                path=provider.path,
                url=provider.url,
                operation_key=key,
                params=PARAMS,
                reference=f"ref-{key}",
                status=status,
                replace=False,  # a second effect must fail, and be counted, not overwrite
            )
        except sqlite3.IntegrityError:
            self.violations.append(f"{key}: a second effect at {provider.name}")
            return 0
        return int(stored.get("seq", 0))

    def intend(self, key: str, intent: str) -> None:
        self.keys[key]["intent"] = intent

    def publish(self, key: str, provider: Provider) -> None:
        """Tell the resumer about a key left behind, and when its lease will have lapsed."""
        if self.shared_dir is not None:
            lapsed_at = time.time() + provider.lease_seconds + 0.5
            with open(self.shared_dir / f"{self.name}.keys", "a", encoding="utf-8") as handle:
                handle.write(f"{lapsed_at} {key}\n")

    def run_due(self, *, all_of_them: bool = False) -> None:
        """Run the deferred steps whose time has come (or all, at the end: also the steps
        they defer in turn, which are bounded retries)."""
        while self.later:
            now = time.monotonic()
            due = [item for item in self.later if all_of_them or item[0] <= now]
            self.later = [item for item in self.later if item not in due]
            for at, _, step in sorted(due, key=lambda item: item[0]):
                delay = at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                step()
            if not all_of_them:
                return


# -- roles ----------------------------------------------------------------------------------


def role_lifecycle(client: Client) -> None:
    provider = client.providers[0]
    for i in _iterations(client):
        key = f"{client.name}-{i}"
        if not client.registered_and_approved(key, provider):
            continue
        token = client.dispatch(key)
        if token and client.report(key, token).ok:
            client.lifecycles += 1


def role_httpx(client: Client) -> None:
    """``lifecycle`` written by hand on ``httpx``, as a host engineer would without the library.

    The baseline ``bench/client.py`` holds the library to: the same five requests on the
    same HTTP client the library uses (one ``httpx.Client`` per credential, its
    connections reused when the server keeps them), the digest computed per run, every
    answer's status checked and the fields the next request needs read from it. No
    heartbeat: the effect does nothing, as in ``library``.
    """
    import httpx

    url = f"http://{client.api.host}:{client.api.port}"
    host = httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {client.api.tokens['host']}"}
    )
    approver = httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {client.api.tokens['approver']}"}
    )
    provider = client.providers[0]

    def post(http: httpx.Client, path: str, body: dict[str, Any], status: int) -> dict[str, Any]:
        client.requests += 1
        response = http.post(path, json=body)
        answer: dict[str, Any] = response.json()
        if response.status_code != status:
            raise RuntimeError(f"{path}: HTTP {response.status_code} {answer}")
        return answer

    for i in _iterations(client):
        key = f"{client.name}-{i}"
        operation = f"/api/v1/operations/{key}"
        started = time.perf_counter()
        try:
            digest = providers.digest_of(PARAMS)
            registered = post(
                host,
                "/api/v1/operations",
                {"key": key, "action": "payment.send", "provider": provider.name, "params": PARAMS},
                201,
            )
            if registered["params_digest"] != digest:
                raise RuntimeError(f"Settle digests the params as {registered['params_digest']}")
            opened = post(host, f"{operation}/approvals", {}, 201)
            post(
                approver,
                f"/api/v1/approvals/{opened['approval_id']}/decision",
                {"decision": "approve", "ttl_seconds": 300, "params_digest": digest},
                200,
            )
            held = post(
                host, f"{operation}/dispatch", {"worker": client.name, "params_digest": digest}, 200
            )
            reported = post(
                host,
                f"{operation}/result",
                {"fencing_token": held["fencing_token"], "outcome": "committed"},
                200,
            )
        except (RuntimeError, KeyError, ValueError, httpx.HTTPError) as exc:
            client.api.unexpected.append({"endpoint": "httpx run", "key": key, "error": repr(exc)})
            continue
        elapsed_ms = (time.perf_counter() - started) * 1000
        client.api.calls.append(["httpx run", 200, "", elapsed_ms, None, None])
        if reported.get("state") == "released":
            client.lifecycles += 1
        else:
            client.api.unexpected.append({"endpoint": "httpx run", "key": key, "body": reported})


def role_library(client: Client) -> None:
    """``lifecycle`` through ``settle_client.Host.run``: the benchmark's library loop.

    The same five requests as ``lifecycle`` (register, open approval, approve with the
    digest, dispatch, report committed), made by the library over ``httpx``; the effect
    does nothing, as there. Each run is one ``calls`` entry (``library run``); the HTTP
    requests it made are counted in ``requests``.
    """
    import httpx
    import settle_client

    class Counting(httpx.HTTPTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            client.requests += 1
            return super().handle_request(request)

    url = f"http://{client.api.host}:{client.api.port}"
    transport = Counting()
    host = settle_client.Host(
        url, client.api.tokens["host"], worker=client.name, transport=transport
    )
    approver = settle_client.Approver(url, client.api.tokens["approver"], transport=transport)
    digest = settle_client.params_digest(PARAMS)
    provider = client.providers[0]
    for i in _iterations(client):
        key = f"{client.name}-{i}"
        started = time.perf_counter()
        try:
            outcome = host.run(
                key,
                action="payment.send",
                provider=provider.name,
                params=PARAMS,
                effect=lambda token: None,
                on_approval=lambda approval: approver.approve_digest(
                    approval, params_digest=digest
                ),
            )
        except settle_client.SettleError as exc:
            client.api.unexpected.append(
                {"endpoint": "library run", "key": key, "error": repr(exc)}
            )
            continue
        elapsed_ms = (time.perf_counter() - started) * 1000
        client.api.calls.append(["library run", 200, "", elapsed_ms, None, None])
        if outcome.released and outcome.ran_effect:
            client.lifecycles += 1
        else:
            client.api.unexpected.append(
                {"endpoint": "library run", "key": key, "outcome": str(outcome)}
            )


def role_steady(client: Client) -> None:
    for i in _iterations(client):
        provider = client.providers[i % len(client.providers)]
        key = f"{client.name}-{i}"
        variant = (i // len(client.providers)) % 6
        permit_id = client.approved(key, provider)
        if not permit_id:
            continue
        if variant == 4:  # revoked before dispatch: nothing may run it any more
            revoked = client.revoke(key, permit_id)
            client.api.check(revoked, "revoke", key, revoked=True)
            if revoked.ok and revoked.body.get("revoked") is True:
                client.dispatch(key, expect=("409:revoked",))
                decision, _, _ = client.resume(key, decisions=("closed",))
                if decision == "closed":
                    client.intend(key, "revoked")
            continue
        token = client.dispatch(key)
        if not token:
            continue
        if variant == 5:  # revoked after dispatch: the consumed permit stays consumed
            revoked = client.revoke(key, permit_id)
            client.api.check(revoked, "revoke", key, revoked=False, status="consumed")
        lost = ("200", "409:lease_lost") if provider.short_lease else ("200",)
        if variant == 3:
            client.heartbeat(key, token, expect=lost)
            report = client.report(key, token, "failed")
            settled = {} if provider.short_lease else {"state": "failed"}
            client.api.check(report, "report failed", key, applied=True, **settled)
            if report.ok:
                client.intend(key, "failed_short_lease" if provider.short_lease else "failed")
            continue
        client.perform(key, provider)
        client.heartbeat(key, token, expect=lost)
        report = client.report(key, token)
        settled = {} if provider.short_lease else {"state": "released"}
        client.api.check(report, "report committed", key, applied=True, **settled)
        if report.ok:
            client.intend(key, "committed")
            client.lifecycles += 1


def role_racer(client: Client) -> None:
    provider = client.providers[0]
    number = -1
    while time.time() < client.deadline:
        number = max(number + 1, int((time.time() - client.t0) / RACE_SLOT_SECONDS))
        _race(client, provider, f"race-{number}", number)


def _race(client: Client, provider: Provider, key: str, number: int) -> None:
    if not client.register(key, provider, expect=("200", "201")).ok:
        return
    opened = client.open_approval(key, expect=("200", "201", "409:invalid_state"))
    permit_id = ""
    if opened.ok:
        decided = client.approve(
            key, str(opened.body.get("approval_id")), expect=("200", "409:already_decided")
        )
        if not (decided.ok or decided.code == "already_decided"):
            return
        permit_id = str(decided.body.get("permit_id") or "")
    elif opened.code != "invalid_state":
        return
    if client.index == 0 and number % 5 == 0:
        permit_id = permit_id or str((client.record(key).get("permit") or {}).get("permit_id", ""))
        if permit_id:
            client.revoke(key, permit_id)
    if (number + client.index) % 2 == 0:
        token = client.dispatch(key, expect=("200", "409:already_consumed", "409:revoked"))
    else:
        _, token, _ = client.resume(
            key, decisions=("dispatch", "in_progress", "released", "closed")
        )
    if not token:
        if client.index == 1 and number % 3 == 0:  # a loser presenting a forged token
            forged = "forged-" + client.name
            client.report(key, forged, expect=("409:stale_fencing_token",))
            client.heartbeat(key, forged, expect=("409:stale_fencing_token",))
        return
    client.perform(key, provider)
    client.heartbeat(key, token)
    report = client.report(key, token)
    client.api.check(report, "report committed", key, applied=True, state="released")
    if report.ok:
        client.intend(key, "committed")


def role_crasher(client: Client) -> None:
    provider = client.providers[0]
    wait = provider.lease_seconds + 0.6
    for i in _iterations(client):
        client.run_due()
        key = f"{client.name}-{i}"
        if not client.approved(key, provider):
            continue
        token = client.dispatch(key)
        if not token:
            continue
        variant = i % 4
        if variant == 1:  # crashed before performing the effect
            client.intend(key, "crash_before_effect")
            client.publish(key, provider)
            continue
        client.perform(key, provider)
        client.intend(key, "crash_after_effect")
        if variant == 0:
            client.publish(key, provider)
        elif variant == 2:  # the worker wakes up after its lease lapsed, and reports
            client.later.append(
                (time.monotonic() + wait, key, lambda k=key, t=token: _late(client, k, t))
            )
        else:  # a fresh worker resumes it once the lease has lapsed
            client.later.append(
                (
                    time.monotonic() + wait,
                    key,
                    lambda k=key: _fresh_worker(client, k),
                )
            )
    client.run_due(all_of_them=True)


def _fresh_worker(client: Client, key: str) -> None:
    """Resume a lapsed operation whose effect was performed: it must end released.

    The first answer is ``in_progress`` (resume moved it to ``unknown`` and queued a
    lookup), until the background worker's lookup found the matching evidence. Nothing
    else resumes this key, so no other lookup can have found anything else.
    """
    client.resume_polled(
        key, ("released", "in_progress"), then=functools.partial(_released, client, key)
    )


def _released(client: Client, key: str, decision: str) -> None:
    """Once released, a further resume answers the same: nothing is looked up again."""
    if decision == "released":
        client.resume(key, decisions=("released",))


def _late(client: Client, key: str, token: str) -> None:
    client.heartbeat(key, token, expect=("409:lease_lost",))
    client.report(key, token)


def role_callbacker(client: Client) -> None:
    provider = client.providers[0]
    digest = providers.digest_of(PARAMS)
    for i in _iterations(client):
        key = f"{client.name}-{i}"
        if not client.approved(key, provider):
            continue
        token = client.dispatch(key)
        if not token:
            continue
        variant = i % 5
        status = "failed" if variant == 4 else "committed"
        seq = client.perform(key, provider, status=status)
        payload = {
            "operation_key": key,
            "status": status,
            "params_digest": digest,
            "reference": f"ref-{key}",
            "sequence": seq,
        }
        check = client.api.check
        if variant == 0:  # the worker crashed; the provider's callback settles it
            check(client.callback(key, provider, payload), "callback", key, state="released")
            client.intend(key, "committed")
        elif variant == 1:  # the worker's report first, then the provider's callback
            client.report(key, token)
            check(client.callback(key, provider, payload), "callback", key, state="released")
            client.intend(key, "committed")
        elif variant == 2:  # evidence for other params, then the real one, then a replay
            other = {**payload, "params_digest": providers.digest_of(OTHER_PARAMS)}
            mismatch = client.callback(key, provider, other)
            check(mismatch, "callback", key, applied=True, state="reconcile")
            newer = {**payload, "sequence": seq + 1}
            check(client.callback(key, provider, newer), "callback", key, state="released")
            replay = client.callback(key, provider, newer)
            check(replay, "callback", key, applied=False, reason="stale_sequence")
            client.intend(key, "committed")
        elif variant == 3:  # a forged callback, then the worker crashes
            client.callback(key, provider, payload, expect=("401:bad_signature",), secret="forged")
            client.intend(key, "crash_after_effect")
            client.publish(key, provider)
        else:  # the provider's own record says "not performed"
            failed = client.callback(key, provider, payload)
            check(failed, "callback", key, applied=True, state="failed")
            client.intend(key, "provider_failed")


def role_resumer(client: Client) -> None:
    """Poll each published key once its lease lapsed, many keys at once (deferred polls).

    A crash before the effect ends ``unknown`` (absent, the next lookup not due yet) or
    ``reconcile``; a crash after it, ``released``.
    """
    assert client.shared_dir is not None
    decisions = ("released", "unknown", "reconcile", "in_progress")
    resumed: set[str] = set()
    while time.time() < client.deadline:
        client.run_due()
        due = [
            key
            for lapsed_at, key in _published(client.shared_dir)
            if lapsed_at < time.time() and key not in resumed
        ]
        for key in due[:5]:
            resumed.add(key)
            client.resume_polled(key, decisions, then=functools.partial(_released, client, key))
        if not due:
            time.sleep(0.05)
    client.run_due(all_of_them=True)


def _published(directory: Path) -> list[tuple[float, str]]:
    found = []
    for path in sorted(directory.glob("*.keys")):
        for line in path.read_text("utf-8").splitlines():
            at, _, key = line.partition(" ")
            with contextlib.suppress(ValueError):
                found.append((float(at), key))
    return found


def _iterations(client: Client) -> Iterable[int]:
    # The loop's CPU is counted from here: a role's set-up (an httpx client builds its
    # TLS context) is paid once per process, not per request.
    client.cpu_started = time.process_time()
    i = 0
    while time.time() < client.deadline:
        yield i
        i += 1


ROLES = {
    "lifecycle": role_lifecycle,
    "httpx": role_httpx,
    "library": role_library,
    "steady": role_steady,
    "racer": role_racer,
    "crasher": role_crasher,
    "callbacker": role_callbacker,
    "resumer": role_resumer,
}


# -- the client process ------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--name", required=True, help="client name; also its keys' prefix")
    parser.add_argument("--role", choices=ROLES, required=True)
    parser.add_argument("--index", type=int, default=0, help="index among clients of the role")
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--go-file", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--providers", default="[]", help="JSON list of providers")
    parser.add_argument("--shared-dir", default="")
    parser.add_argument("--gate-timeout", type=float, default=120.0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    api = Api(
        args.url,
        os.environ.get("SETTLE_HOST_TOKEN", ""),
        os.environ.get("SETTLE_APPROVER_TOKEN", ""),
    )
    client = Client(
        api=api,
        name=args.name,
        index=args.index,
        providers=[Provider(**p) for p in json.loads(args.providers)],
        shared_dir=Path(args.shared_dir) if args.shared_dir else None,
    )
    emit("ready")
    wait_for_file(args.go_file, args.gate_timeout, "go")
    client.t0 = os.stat(args.go_file).st_mtime
    client.deadline = client.t0 + args.seconds
    started = time.time()
    client.cpu_started = time.process_time()
    ROLES[args.role](client)
    result = {
        "name": args.name,
        "role": args.role,
        "started": started,
        "finished": time.time(),
        "cpu": time.process_time() - client.cpu_started,  # this client's own, in its loop
        "lifecycles": client.lifecycles,
        "requests": client.requests,
        "calls": api.calls,
        "unexpected": api.unexpected,
        "tokens": dict(client.tokens),
        "keys": client.keys,
        "violations": client.violations,
        "resumes": dict(client.resumes),
    }
    temporary = Path(args.out + ".tmp")
    temporary.write_text(json.dumps(result), "utf-8")
    temporary.replace(args.out)
    emit("done", calls=len(api.calls))
    return 0


# -- the parent's side ----------------------------------------------------------------------


@dataclass
class FleetSpec:
    """One client to start: its name, role, providers (``--providers``) and more arguments."""

    name: str
    role: str
    providers: list[dict[str, Any]] = field(default_factory=list)
    args: list[str] = field(default_factory=list)


def fleet_run(
    *,
    url: str,
    host_token: str,
    approver_token: str,
    clients: list[FleetSpec],
    seconds: float,
    directory: Path,
    ready_timeout: float = 60.0,
    grace: float = 60.0,
    on_go: Callable[[], None] | None = None,
) -> list[dict[str, Any]]:
    """Start every client, release them together, wait (bounded) and collect their results.

    ``on_go`` is called once every client is ready, just before they are released (a
    benchmark starts its meters there, after the clients' own start-up).

    Whatever happens, every process started here is killed (if still running) and reaped
    before this returns or raises. A client that wrote no result is returned as
    ``{"name", "role", "error", "exit_code"}`` with its stderr's tail.
    """
    directory.mkdir(parents=True, exist_ok=True)
    shared = directory / "shared"
    shared.mkdir(exist_ok=True)
    go_file = directory / "go"
    env = {
        **os.environ,
        "SETTLE_HOST_TOKEN": host_token,
        "SETTLE_APPROVER_TOKEN": approver_token,
        "PYTHONUNBUFFERED": "1",
    }
    started: list[tuple[FleetSpec, subprocess.Popen[bytes]]] = []
    try:
        for spec in clients:
            command = [
                sys.executable,
                str(FLEET_SCRIPT),
                "--url",
                url,
                "--name",
                spec.name,
                "--role",
                spec.role,
                "--seconds",
                str(seconds),
                "--go-file",
                str(go_file),
                "--out",
                str(directory / f"{spec.name}.json"),
                "--providers",
                json.dumps(spec.providers),
                "--shared-dir",
                str(shared),
                *spec.args,
            ]
            with (
                open(directory / f"{spec.name}.stdout", "wb") as stdout,
                open(directory / f"{spec.name}.stderr", "wb") as stderr,
            ):
                process = subprocess.Popen(
                    command,
                    cwd=REPO_ROOT,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=stdout,
                    stderr=stderr,
                )
            started.append((spec, process))
        _await_ready(directory, started, time.monotonic() + ready_timeout)
        if on_go is not None:
            on_go()
        go_file.touch()
        deadline = time.monotonic() + seconds + grace
        for spec, process in started:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"fleet client {spec.name} did not finish in time") from None
    finally:
        for _, process in started:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
    return [_result(directory, spec, process) for spec, process in started]


def _await_ready(
    directory: Path, started: list[tuple[FleetSpec, subprocess.Popen[bytes]]], deadline: float
) -> None:
    waiting = {spec.name: process for spec, process in started}
    while waiting:
        for name, process in list(waiting.items()):
            with contextlib.suppress(OSError):
                if '"event": "ready"' in (directory / f"{name}.stdout").read_text("utf-8"):
                    del waiting[name]
                    continue
            if process.poll() is not None:
                raise RuntimeError(
                    f"fleet client {name} exited before ready: {_tail(directory, name)}"
                )
        if time.monotonic() > deadline:
            raise RuntimeError(f"fleet clients not ready in time: {sorted(waiting)}")
        time.sleep(0.02)


def _tail(directory: Path, name: str) -> str:
    with contextlib.suppress(OSError):
        return (directory / f"{name}.stderr").read_text("utf-8", "replace")[-2000:]
    return ""


def _result(directory: Path, spec: FleetSpec, process: subprocess.Popen[bytes]) -> dict[str, Any]:
    path = directory / f"{spec.name}.json"
    try:
        result: dict[str, Any] = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return {
            "name": spec.name,
            "role": spec.role,
            "exit_code": process.returncode,
            "error": _tail(directory, spec.name) or "no result written",
        }
    return result


if __name__ == "__main__":
    sys.exit(main())
