"""Soak: ten client processes drive every kind of call at once through gunicorn (4 workers).

Settle runs as in production (``gunicorn settle.wsgi -w 4``, ``harness/gunicorn.py``,
and a real ``celery -A settle worker`` on this test's own queue of the Redis broker the
environment names) against pytest-django's PostgreSQL test database. Resume never looks a
provider up inside a request: it queues the lookup for the Celery worker and answers
``in_progress``, and the clients poll until the worker's lookup settled it. The clients
(``harness/fleet``) only speak HTTP, on three providers: a SQLite one (60 s lease)
shared by racers that fight over the same keys, a journal one with a 1 s lease whose
workers "crash" (and are resumed, or report late), and an HTTP one (1 s lease, signed
callbacks: matching, mismatching, stale, forged, "not performed"), while steady clients
run whole lifecycles on all three, with heartbeats, failed reports and revocations before
and after dispatch.

Each client judges every answer against what may happen at that point (a lost race's
409 ``already_consumed`` is fine; a 5xx, a malformed answer or a transport error never
is). Afterwards every lapsed operation is resumed (polled while ``in_progress``) and,
through the API and the providers' own records, the test checks: no unexpected answer,
no deadlock counted by PostgreSQL, at most one fencing token, one consumption and one
provider effect per operation, every release backed by the host's success receipt or by
a recovery receipt pointing at matching evidence, each scenario's expected ending, and an
intact audit chain.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection

from approvals.services.approvers import approver_create
from audit.verify_walk import audit_verify
from harness.fleet.run import FleetSpec, fleet_run
from harness.gunicorn import (
    GunicornServer,
    database_url,
    gunicorn_running,
    gunicorn_stop,
    pg_deadlocks,
    pg_wait_for_other_sessions,
)
from recovery.services.credentials import host_create
from tests.support.live import Http, ProviderHandle

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

SOAK_SECONDS = 8.0
CALLBACK_SECRET = "soak-callback-secret"
# What each scenario must have become once the lapsed operations were resumed.
ENDINGS = {
    "committed": {"released"},
    "crash_after_effect": {"released"},
    "failed": {"failed"},
    # Reported failed after the 1 s lease lapsed: only the provider may settle it, and
    # it holds nothing.
    "failed_short_lease": {"failed", "unknown", "reconcile"},
    "crash_before_effect": {"unknown", "reconcile"},
    "provider_failed": {"failed"},
    "revoked": {"revoked"},
}
UNSETTLED = {"dispatched", "unknown", "reconcile"}
# The final sweep's polls of one operation while it is in_progress, and the longest wait.
SWEEP_POLLS = 15
SWEEP_WAIT = 1.0


@pytest.fixture
def background(transactional_db: None, celery_env: dict[str, str | None]) -> dict[str, str | None]:
    """What gunicorn and the Celery worker share: database, broker, queue, checkpoints."""
    if connection.vendor != "postgresql":
        pytest.skip("the fleet soak runs gunicorn on the PostgreSQL test database only")
    env = dict(celery_env)
    assert env["DATABASE_URL"] == database_url(connection.settings_dict)
    checkpoints = getattr(settings, "SETTLE_AUDIT_CHECKPOINT_FILE", None)
    if checkpoints is not None:  # the test's own audit checkpoint file, if Settle has one
        env["SETTLE_AUDIT_CHECKPOINT_FILE"] = str(checkpoints)
    return env


@pytest.fixture
def server(background: dict[str, str | None], tmp_path: Path) -> Iterator[GunicornServer]:
    env = {name: value for name, value in background.items() if value is not None}
    # Ten processes share one host token as fast as they go, and a burst of them can
    # pass the limit per credential (one CI run saw 1,006 registers refused): a 429 is
    # no safety rule's answer. The limit has tests of its own (test_rate_limit,
    # test_fault_flood); here it is off, as in the API benchmarks.
    env["SETTLE_HOST_RATE_PER_SECOND"] = "0"
    with gunicorn_running(
        database_url=env.pop("DATABASE_URL"), log_path=tmp_path / "gunicorn.log", env=env
    ) as running:
        yield running


def _provider(handle: ProviderHandle, lease_seconds: int) -> dict[str, Any]:
    return {
        "kind": handle.kind,
        "name": handle.name,
        "path": handle.path,
        "url": handle.url,
        "secret": handle.secret,
        "lease_seconds": lease_seconds,
    }


def _fleet(
    sqlite: dict[str, Any], journal: dict[str, Any], http: dict[str, Any]
) -> list[FleetSpec]:
    every = [sqlite, journal, http]
    return [
        *(FleetSpec(f"steady{i}", "steady", every, ["--index", str(i)]) for i in range(2)),
        *(FleetSpec(f"racer{i}", "racer", [sqlite], ["--index", str(i)]) for i in range(3)),
        *(FleetSpec(f"crasher{i}", "crasher", [journal], ["--index", str(i)]) for i in range(2)),
        *(FleetSpec(f"callbacker{i}", "callbacker", [http], ["--index", str(i)]) for i in range(2)),
        FleetSpec("resumer", "resumer", every),
    ]


class Outcome:
    """Everything the clients reported, merged."""

    def __init__(self, results: list[dict[str, Any]]) -> None:
        self.failed_clients = [r for r in results if "error" in r]
        finished = [r for r in results if "error" not in r]
        self.unexpected = [u | {"client": r["name"]} for r in finished for u in r["unexpected"]]
        self.violations = [v for r in finished for v in r["violations"]]
        self.calls = Counter(
            f"{endpoint} {status}{':' + code if code else ''}"
            for r in finished
            for endpoint, status, code, *_ in r["calls"]
        )
        self.resumes: Counter[str] = Counter()
        for r in finished:
            self.resumes.update(r.get("resumes", {}))
        self.tokens: Counter[str] = Counter()
        self.provider: dict[str, str] = {}
        self.intent: dict[str, str] = {}
        for r in finished:
            self.tokens.update(r["tokens"])
            for key, meta in r["keys"].items():
                self.provider[key] = meta["provider"]
                if meta["intent"] != "aborted" or key not in self.intent:
                    self.intent[key] = meta["intent"]

    def summary(self, records: dict[str, dict[str, Any]] | None = None) -> str:
        lines = [f"{len(self.intent)} operations; calls by answer:"]
        lines += [f"  {n:6d}  {what}" for what, n in sorted(self.calls.items())]
        lines += ["resumes by decision (clients):"]
        lines += [f"  {n:6d}  {what}" for what, n in sorted(self.resumes.items())]
        if records is not None:
            endings = Counter(
                f"{intent} → {records.get(key, {}).get('state')}"
                for key, intent in self.intent.items()
            )
            lines += ["scenario → state after the final resume:"]
            lines += [f"  {n:6d}  {what}" for what, n in sorted(endings.items())]
        return "\n".join(lines)


def _get(host: Http, key: str) -> tuple[int, dict[str, Any]]:
    return host.get(f"/api/v1/operations/{key}")


def _sweep(host: Http, intents: dict[str, str]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Resume every unsettled operation (leases have lapsed); return the records.

    Resume queues a lookup for the Celery worker and answers ``in_progress``: it is asked
    again after ``retry_after`` (``SWEEP_WAIT`` at most), ``SWEEP_POLLS`` times at most,
    until it answers what the lookup settled. Still ``in_progress`` after that is a
    problem: the worker never ran the lookup.
    """
    problems: list[str] = []

    def settle_one(key: str) -> tuple[str, dict[str, Any]]:
        try:
            return resume_lapsed(key)
        except Exception as exc:  # a transport error or a body that is not JSON
            problems.append(f"{key}: final sweep failed: {type(exc).__name__}: {exc}")
            return key, {}

    def resume_lapsed(key: str) -> tuple[str, dict[str, Any]]:
        status, record = _get(host, key)
        if status == 200 and record["state"] in UNSETTLED:
            path = f"/api/v1/operations/{key}/resume"
            for _ in range(SWEEP_POLLS):
                status, answer = host.post(path, {"worker": "sweeper"})
                if status != 200 or answer.get("fencing_token"):
                    problems.append(f"{key}: final resume answered {status} {answer}")
                    break
                if answer.get("decision") != "in_progress":
                    break
                retry_after = float(answer.get("retry_after") or 0)
                if retry_after < 1:
                    problems.append(f"{key}: in_progress without retry_after: {answer}")
                    break
                time.sleep(min(retry_after, SWEEP_WAIT))
            else:
                problems.append(f"{key}: still in_progress after {SWEEP_POLLS} resumes")
            status, record = _get(host, key)
        if status != 200:
            problems.append(f"{key}: GET answered {status} {record}")
            return key, {}
        return key, record

    with ThreadPoolExecutor(max_workers=4) as pool:
        records = dict(pool.map(settle_one, sorted(intents)))
    return records, problems


def _safety(
    outcome: Outcome, records: dict[str, dict[str, Any]], handles: dict[str, ProviderHandle]
) -> list[str]:
    """The safety rules, judged from the API's records and the providers' own records."""
    problems = [f"violation reported by a client: {v}" for v in outcome.violations]
    for key, record in records.items():
        if not record:
            continue
        permit = record.get("permit") or {}
        dispatch = record.get("dispatch")
        receipt = record.get("receipt")
        evidence = {e["evidence_id"]: e for e in record.get("evidence", [])}
        consumed = sum(1 for event in permit.get("history", []) if event["kind"] == "consumed")
        effects = handles[outcome.provider[key]].effects(key)
        state = record["state"]
        if outcome.tokens[key] > 1:
            problems.append(f"{key}: {outcome.tokens[key]} fencing tokens handed out")
        if consumed > 1:
            problems.append(f"{key}: the permit was consumed {consumed} times")
        if outcome.tokens[key] and dispatch is None:
            problems.append(f"{key}: a fencing token was handed out but there is no dispatch")
        if dispatch is not None and (
            permit.get("status") != "consumed" or dispatch["permit_id"] != permit.get("permit_id")
        ):
            problems.append(f"{key}: dispatch without its consumed permit: {permit}")
        if effects > 1:
            problems.append(f"{key}: the provider holds {effects} effects")
        if effects and dispatch is None:
            problems.append(f"{key}: a provider effect without a dispatch")
        if state in UNSETTLED | {"released", "failed"} and dispatch is None:
            problems.append(f"{key}: {state} without a dispatch")
        if state == "released":
            if receipt is None or receipt["status"] != "succeeded":
                problems.append(f"{key}: released without a succeeded receipt: {receipt}")
            elif receipt["recovered"]:
                cited = evidence.get(receipt["evidence_id"])
                if cited is None or (cited["verdict"], cited["provider_status"]) != (
                    "match",
                    "committed",
                ):
                    problems.append(f"{key}: recovery receipt cites {cited}, not a match")
                if not effects:
                    problems.append(f"{key}: released from evidence the provider does not hold")
            if record["recovered"] and not any(
                (e["verdict"], e["provider_status"]) == ("match", "committed")
                for e in evidence.values()
            ):
                problems.append(f"{key}: released as recovered without matching evidence")
    return problems


def _endings(outcome: Outcome, records: dict[str, dict[str, Any]]) -> list[str]:
    problems = []
    for key, intent in sorted(outcome.intent.items()):
        allowed = ENDINGS.get(intent)
        state = records.get(key, {}).get("state")
        if allowed is not None and state not in allowed:
            problems.append(f"{key}: {intent} ended {state}, expected one of {sorted(allowed)}")
    return problems


def test_fleet_of_processes_keeps_every_safety_rule_under_load(
    server: GunicornServer,
    background: dict[str, str | None],
    celery_procs: Any,
    make_provider: Any,
    tmp_path: Path,
) -> None:
    worker = celery_procs("worker", background)
    sqlite = make_provider("sqlite", lease_seconds=60)
    journal = make_provider("journal", lease_seconds=1)
    http = make_provider("http", lease_seconds=1, secret=CALLBACK_SECRET)
    handles = {handle.name: handle for handle in (sqlite, journal, http)}
    _, host_token = host_create(name="soak-host")
    _, approver_token = approver_create(name="soak-approver", all_providers=True)
    deadlocks_before = pg_deadlocks(connection)

    results = fleet_run(
        url=server.url,
        host_token=host_token,
        approver_token=approver_token,
        clients=_fleet(_provider(sqlite, 60), _provider(journal, 1), _provider(http, 1)),
        seconds=SOAK_SECONDS,
        directory=tmp_path / "fleet",
    )
    outcome = Outcome(results)
    assert not outcome.failed_clients, outcome.failed_clients

    time.sleep(1.5)  # the last 1 s leases lapse
    records, problems = _sweep(Http(server.url, host_token), outcome.intent)
    gunicorn_stop(server)
    worker.stop()
    assert pg_wait_for_other_sessions(connection), "gunicorn's or Celery's sessions did not end"
    deadlocks = pg_deadlocks(connection) - deadlocks_before

    unexpected = Counter(f"{u['endpoint']} → {u.get('outcome')}" for u in outcome.unexpected)
    if unexpected:
        problems.insert(0, f"unexpected answers: {dict(unexpected.most_common())}")
        problems += [f"  e.g. {u}" for u in outcome.unexpected[:8]]
    if deadlocks:
        problems.insert(0, f"PostgreSQL counted {deadlocks} deadlock(s) during the soak")
    problems += _safety(outcome, records, handles)
    problems += _endings(outcome, records)
    breaks = list(audit_verify())
    if breaks:
        problems.append(f"audit chain broken: {breaks}")
    else:
        call_command("verify_audit")
    print(outcome.summary(records))
    if problems:
        pytest.fail(
            "\n".join(
                [
                    *problems[:60],
                    outcome.summary(records),
                    "gunicorn log:",
                    _log_highlights(server),
                    "Celery worker log:",
                    worker.log()[-3000:],
                ]
            ),
            pytrace=False,
        )


def _log_highlights(server: GunicornServer) -> str:
    """gunicorn's log without Django's one-line warnings about 4xx answers."""
    quiet = ("Conflict:", "Unauthorized:", "Not Found:", "Bad Request:", "Unprocessable")
    lines = server.log_tail(200_000).splitlines()
    return "\n".join([line for line in lines if not line.startswith(quiet)][-40:])
