"""A refusal flood from several client processes: one host cannot flood the record.

gunicorn with four workers on PostgreSQL, its rate limit counted in Redis (the broker's,
the default). Four client processes hammer ``dispatch`` on one already-dispatched
operation with one host's token while a fifth, another host, goes about its business.
The flood gets 429s with Retry-After (the limit is shared by every worker), the other
host none; every refusal that was answered 409 is on the record, in bounded volume (the
first N of a minute one by one, the rest counted in one summary line); the operation
page stays small and reads a bounded number of statements, and the API's history
answers one bounded page.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
import time

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from approvals.models import PermitEvent
from approvals.services.approvers import approver_create
from audit.models import AuditEvent
from harness.gunicorn import database_url, gunicorn_running
from harness.providers import digest_of, sqlite_provider_init
from recovery import contract
from recovery.services.credentials import host_create
from recovery.services.providers import provider_configure
from tests.support.celery_fixtures import BROKER
from tests.support.console import console_user
from tests.support.flow import PARAMS
from tests.support.live import Http

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

RATE, BURST = 5, 10  # a window of 2 s holding 10 requests per credential
RECORDED = 5  # refusals of one reason a minute recorded one by one
FLOOD_SECONDS = 4.0
CLIENTS = 4
PAGE_BYTES = 40 * 1024
PAGE_STATEMENTS = 20

# One client process: dispatch as fast as it can for a while; what it was answered.
CLIENT = textwrap.dedent(
    """
    import json, sys, time, urllib.request, urllib.error
    url, token, seconds, digest = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    body = json.dumps({"worker": "flood", "params_digest": digest}).encode()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    counts, waits, deadline = {}, [], time.monotonic() + seconds
    first = time.time()
    while time.monotonic() < deadline:
        request = urllib.request.Request(url, data=body, method="POST", headers={
            "Content-Type": "application/json", "Authorization": "Bearer " + token})
        try:
            with opener.open(request, timeout=10) as response:
                status, headers, payload = response.status, response.headers, response.read()
        except urllib.error.HTTPError as exc:
            status, headers, payload = exc.code, exc.headers, exc.read()
        code = json.loads(payload).get("error", "")
        counts[f"{status} {code}"] = counts.get(f"{status} {code}", 0) + 1
        if status == 429:
            waits.append(headers.get("Retry-After"))
    print(json.dumps({"counts": counts, "waits": waits, "span": [first, time.time()]}))
    """
)


def _ok(answer: tuple[int, dict], step: str) -> dict:
    status, body = answer
    assert 200 <= status < 300, (step, status, body)
    return body


def test_a_refusal_flood_is_rate_limited_and_keeps_the_record_bounded(tmp_path):
    if connection.vendor != "postgresql":
        pytest.skip("gunicorn's workers share the PostgreSQL test database")
    if not BROKER.startswith("redis://"):
        pytest.skip("CELERY_BROKER_URL must name a Redis database: the limit is counted there")
    provider_db = tmp_path / "orders.sqlite3"
    sqlite_provider_init(provider_db)
    provider, _ = provider_configure(name="orders", adapter="sqlite", path=str(provider_db))
    _, flood_token = host_create(name="flooder")
    _, neighbour_token = host_create(name="neighbour")
    _, approver_token = approver_create(name="phone", all_providers=True)
    env = {
        "CELERY_BROKER_URL": BROKER,
        "SETTLE_CACHE_URL": None,  # the default: the broker's Redis
        "SETTLE_HOST_RATE_PER_SECOND": str(RATE),
        "SETTLE_HOST_RATE_BURST": str(BURST),
        "SETTLE_REFUSALS_RECORDED_PER_MINUTE": str(RECORDED),
    }
    with gunicorn_running(
        database_url=database_url(connection.settings_dict),
        log_path=tmp_path / "gunicorn.log",
        env=env,
    ) as server:
        host = Http(server.url, flood_token)
        neighbour = Http(server.url, neighbour_token)
        approver = Http(server.url, approver_token)
        body = {"key": "flood-1", "action": "payment.send", "provider": "orders", "params": PARAMS}
        _ok(host.post("/api/v1/operations", body), "register")
        approval = _ok(host.post("/api/v1/operations/flood-1/approvals"), "open")
        decision = {"decision": "approve", "params_digest": digest_of(PARAMS)}
        _ok(approver.post(f"/api/v1/approvals/{approval['approval_id']}/decision", decision), "ok")
        dispatch = {"worker": "w1", "params_digest": digest_of(PARAMS)}
        _ok(host.post("/api/v1/operations/flood-1/dispatch", dispatch), "dispatch")
        time.sleep(2.1)  # a fresh window of the limit for the flood

        url = f"{server.url}/api/v1/operations/flood-1/dispatch"
        clients = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    CLIENT,
                    url,
                    flood_token,
                    str(FLOOD_SECONDS),
                    digest_of(PARAMS),
                ],
                stdout=subprocess.PIPE,
            )
            for _ in range(CLIENTS)
        ]
        neighbour_answers = []
        started = time.monotonic()
        while time.monotonic() - started < FLOOD_SECONDS:
            neighbour_answers.append(neighbour.get("/api/v1/operations/none")[0])
            time.sleep(0.3)  # within its own rate
        results = [json.loads(client.communicate(timeout=30)[0]) for client in clients]

        counts: dict[str, int] = {}
        waits: list[str] = []
        for result in results:
            for answer, n in result["counts"].items():
                counts[answer] = counts.get(answer, 0) + n
            waits += result["waits"]
        assert set(counts) == {"409 already_consumed", "429 rate_limited"}, counts
        assert waits and all(wait.isdigit() and 1 <= int(wait) <= 2 for wait in waits), waits
        # One limit for the four processes, whichever gunicorn worker answered each: the
        # flood touched as many of the limit's 2 s windows as its requests spanned (the
        # processes start apart on a busy machine), one more for where they fell.
        span = max(r["span"][1] for r in results) - min(r["span"][0] for r in results)
        windows = math.ceil(span / 2) + 1
        assert counts["409 already_consumed"] <= BURST * windows, counts
        assert set(neighbour_answers) == {404}, neighbour_answers  # never limited

        time.sleep(2.1)  # past the flood's Retry-After
        status, record = host.get("/api/v1/operations/flood-1")
        assert status == 200
        assert len(record["permit"]["history"]) <= contract.HISTORY_PAGE + 1
        status, page = host.get("/api/v1/operations/flood-1/history?limit=10")
        # Ten events at most, and on the first page the lines the permit's row records
        # (issued, consumed): twelve once the flood's record spans two minutes' windows.
        assert status == 200 and len(page["lines"]) <= 10 + 2, page["lines"]
        assert len(json.dumps(record)) < 40 * 1024

    # Every refusal answered 409 is on the record, in bounded volume.
    refused = list(PermitEvent.objects.filter(kind=PermitEvent.Kind.REFUSED))
    minutes = 2  # the flood may straddle a minute's boundary
    assert len(refused) <= minutes * (RECORDED + 1), len(refused)
    on_record = sum(event.detail.get("count", 1) for event in refused)
    assert on_record == counts["409 already_consumed"]
    audit = AuditEvent.objects.filter(operation_key="flood-1", kind="consume_refused").count()
    assert audit <= minutes * (RECORDED + 1) + 1, audit

    user = console_user("sam", "supervisor", provider)
    client = Client()
    client.force_login(user)
    with CaptureQueriesContext(connection) as queries:
        response = client.get("/operations/flood-1/")
    assert response.status_code == 200
    assert len(response.content) < PAGE_BYTES, len(response.content)
    assert len(queries.captured_queries) <= PAGE_STATEMENTS, len(queries.captured_queries)
    print(
        f"flood: {CLIENTS} clients x {FLOOD_SECONDS:g} s: {counts}; neighbour "
        f"{len(neighbour_answers)} answers, none 429; stored: {len(refused)} permit lines, "
        f"{audit} audit events for {on_record} refusals; operation page "
        f"{len(response.content)} bytes in {len(queries.captured_queries)} statements; "
        f"API record {len(json.dumps(record))} bytes"
    )
