"""Reads held for approval on gunicorn's threads, while the fleet goes on.

One gunicorn worker with four threads holds two reads at most (half its threads). Three
hosts wait on three approvals at once: two reads are held, the third is answered at once
(and its host waits on its side); meanwhile the approver's requests are answered, and
each held read answers at its own approval's decision, not at the other's.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from django.db import connection

from harness.gunicorn import database_url, gunicorn_running
from harness.providers import digest_of
from tests.support.flow import PARAMS
from tests.support.live import Http, fleet_and_orders

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def test_two_reads_are_held_on_four_threads_and_each_answers_at_its_decision(
    tmp_path: Path,
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("gunicorn's workers share the PostgreSQL test database")
    host_token, approver_token, _ = fleet_and_orders(tmp_path, lease_seconds=60)
    with gunicorn_running(
        database_url=database_url(connection.settings_dict),
        log_path=tmp_path / "gunicorn.log",
        workers=1,
        threads=4,
    ) as server:
        host, approver = Http(server.url, host_token), Http(server.url, approver_token)
        approvals = {}
        for key in ("w-1", "w-2", "w-3"):
            body = {"key": key, "action": "payment.send", "provider": "orders"}
            status, opened = host.post(
                "/api/v1/operations", {**body, "params": PARAMS, "approval": {}}
            )
            assert status == 201, opened
            approvals[key] = opened["approval"]["approval_id"]
        answered: dict[str, tuple[float, str]] = {}

        def read(key: str) -> None:
            status, record = host.get(f"/api/v1/operations/{key}?wait=20")
            assert status == 200, record
            answered[key] = (time.monotonic(), record["state"])

        readers = [threading.Thread(target=read, args=(key,)) for key in approvals]
        for reader in readers[:2]:
            reader.start()
        time.sleep(1.0)  # both held by now
        began = time.monotonic()
        readers[2].start()
        readers[2].join(timeout=10)
        assert answered["w-3"][1] == "awaiting_approval"  # no third hold: at once
        assert answered["w-3"][0] - began < 5
        assert set(answered) == {"w-3"}  # the first two still held

        decided = {}
        for key, reader in (("w-2", readers[1]), ("w-1", readers[0])):
            path = f"/api/v1/approvals/{approvals[key]}/decision"
            decided[key] = time.monotonic()
            status, body = approver.post(
                path, {"decision": "approve", "params_digest": digest_of(PARAMS)}
            )
            assert status == 200, body  # answered while two threads hold reads
            reader.join(timeout=10)
            at, state = answered[key]  # its read came back at its decision...
            assert state == "approved"
            assert at - decided[key] < 5  # ...long before its 20 s
            if key == "w-2":
                assert "w-1" not in answered  # ...and not at the other's
