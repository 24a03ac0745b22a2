"""A provider that hangs cannot take every web worker: lookups inside requests are bounded.

gunicorn with 4 workers, as in production. Six crashed operations of a provider whose
lookups hang until its timeout are resumed at once; only two may look up (the default
``SETTLE_WEB_LOOKUPS_PER_PROVIDER``), the other four answer at once with
``retry_after``, and meanwhile another operation of another provider runs its whole
lifecycle without waiting.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from approvals.services import approver_create
from recovery.models import LookupAttempt, Operation
from recovery.services.credentials import host_create
from recovery.services.providers import provider_configure
from tests.integration.conftest import PARAMS, Http, wait_lease_lapsed
from tests.support.gunicorn import database_url, gunicorn_running
from tests.support.providers import (
    digest_of,
    http_provider_control,
    http_provider_start,
    http_provider_stop,
    sqlite_provider_init,
)

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

TIMEOUT = 3  # seconds the hanging provider is given per lookup


def _ok(answer: tuple[int, dict[str, Any]], step: str) -> dict[str, Any]:
    status, body = answer
    assert 200 <= status < 300, (step, status, body)
    return body


def _approved(host: Http, approver: Http, key: str, provider: str) -> dict[str, Any]:
    body = {"key": key, "action": "payment.send", "provider": provider, "params": PARAMS}
    _ok(host.post("/api/v1/operations", body), f"{key} register")
    approval = _ok(host.post(f"/api/v1/operations/{key}/approvals"), f"{key} open")
    path = f"/api/v1/approvals/{approval['approval_id']}/decision"
    decision = {"decision": "approve", "params_digest": digest_of(PARAMS)}
    _ok(approver.post(path, decision), f"{key} approve")
    dispatch = {"worker": "w1", "params_digest": digest_of(PARAMS)}
    return _ok(host.post(f"/api/v1/operations/{key}/dispatch", dispatch), f"{key} dispatch")


def test_resumes_against_a_hanging_provider_hold_at_most_two_web_workers(tmp_path: Path) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("gunicorn's workers share the PostgreSQL test database")
    _, host_token = host_create(name="fleet-a")
    _, approver_token = approver_create(name="alice-phone", all_providers=True)
    process, url = http_provider_start(tmp_path, "secret")
    orders = tmp_path / "orders.sqlite3"
    sqlite_provider_init(orders)
    provider_configure(
        name="slow", adapter="http", url=url, secret="secret", lease_seconds=1,
        timeout_seconds=TIMEOUT,
    )  # fmt: skip
    provider_configure(name="orders", adapter="sqlite", path=str(orders), lease_seconds=60)
    try:
        with gunicorn_running(
            database_url=database_url(connection.settings_dict),
            log_path=tmp_path / "gunicorn.log",
            workers=4,
        ) as server:
            host, approver = Http(server.url, host_token), Http(server.url, approver_token)
            keys = [f"hung-{n}" for n in range(6)]
            for key in keys:
                _approved(host, approver, key, "slow")  # and the worker dies: no report
            for key in keys:
                wait_lease_lapsed(key)
            http_provider_control(url, "slow", delay=30)

            answers: dict[str, tuple[float, dict[str, Any]]] = {}

            def resume(key: str) -> None:
                started = time.monotonic()
                body = _ok(host.post(f"/api/v1/operations/{key}/resume", {"worker": "w2"}), key)
                answers[key] = (time.monotonic() - started, body)

            threads = [threading.Thread(target=resume, args=(key,)) for key in keys]
            for thread in threads:
                thread.start()
            time.sleep(0.5)  # the two lookups now hold two of the four workers

            # Meanwhile another provider's operation goes through its whole lifecycle.
            steps: list[float] = []
            started = time.monotonic()
            token = _approved(host, approver, "unrelated", "orders")["fencing_token"]
            steps.append(time.monotonic() - started)
            report = {"fencing_token": token, "outcome": "committed"}
            started = time.monotonic()
            result = _ok(host.post("/api/v1/operations/unrelated/result", report), "report")
            steps.append(time.monotonic() - started)
            assert result["state"] == "released"

            for thread in threads:
                thread.join(timeout=TIMEOUT + 30)
            assert len(answers) == len(keys), answers
    finally:
        http_provider_stop(process)

    looked_up = [key for key, (_, body) in answers.items() if "retry_after" not in body]
    waited = [key for key, (_, body) in answers.items() if "retry_after" in body]
    assert len(looked_up) == 2, answers
    for key in looked_up:
        seconds, body = answers[key]
        assert body["decision"] == "unknown" and seconds >= TIMEOUT - 0.5, (key, answers[key])
    for key in waited:
        seconds, body = answers[key]
        assert body["decision"] == "unknown" and body["retry_after"] >= 1, (key, answers[key])
        assert seconds < 2, (key, answers[key])
    # Two workers were stuck in lookups; the other two served the rest without delay.
    assert max(steps) < TIMEOUT - 0.5, steps
    attempts = LookupAttempt.objects.filter(operation__provider__name="slow")
    assert sorted(attempts.values_list("operation__key", flat=True)) == sorted(looked_up)
    assert set(attempts.values_list("status", flat=True)) == {"finished"}
    assert Operation.objects.get(key="unrelated").state == "released"
