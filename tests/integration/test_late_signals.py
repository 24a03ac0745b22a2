"""Late signals after a verified completion change nothing and are kept on the record.

In-process (no host worker processes), but over real HTTP: the provider's callback goes
through the live server with a real HMAC-SHA256 signature of the raw body. The lookup
that first releases the operation is run by a real Celery worker (``lookup_worker``).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import sqlite3
from typing import Any

import pytest

from audit.models import AuditEvent
from common.actors import Actor
from harness.providers import digest_of, sqlite_provider_commit
from recovery.models import Dispatch, Evidence, LookupAttempt, Verdict
from recovery.services.lookups import operation_lookup
from tests.support.flow import PARAMS
from tests.support.live import (
    Http,
    ProviderHandle,
    Settle,
    assert_audit_intact,
    last_verdict,
    operation,
    permit_events,
    wait_lease_lapsed,
)

pytestmark = [
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("lookup_worker"),
]

SECRET = "callback-secret-for-orders"


def stale_signals(key: str) -> list[str]:
    return list(
        AuditEvent.objects.filter(operation_key=key, kind="stale_signal")
        .order_by("seq")
        .values_list("data__signal", flat=True)
    )


def released_from_evidence(settle: Settle, provider: ProviderHandle, key: str) -> str:
    """Dispatch, commit at the provider, lose the lease, resume until released from evidence."""
    settle.approved(key, provider.name)
    status, dispatched = settle.host.post(
        f"/api/v1/operations/{key}/dispatch",
        {"worker": "w1", "params_digest": digest_of(PARAMS)},
    )
    assert status == 200, dispatched
    sqlite_provider_commit(provider.path, operation_key=key, params=PARAMS, reference="ord-1")
    wait_lease_lapsed(key)
    answers = settle.resume_polled(key, worker="w2")
    assert answers[0]["decision"] == "in_progress", answers  # the lookup is queued
    assert answers[-1] == {"decision": "released", "state": "released", "recovered": True}
    return str(dispatched["fencing_token"])


def signed_callback(
    settle: Settle, provider: str, payload: dict[str, Any], secret: str = SECRET
) -> tuple[int, dict[str, Any]]:
    """POST a provider notification signed with HMAC-SHA256 of its raw body (no token)."""
    raw = json.dumps(payload).encode("utf-8")
    signature = hmac.new(secret.encode("utf-8"), raw, hashlib.sha256).hexdigest()
    return Http(settle.base_url, "").post(
        f"/api/v1/providers/{provider}/callbacks", raw=raw, **{"X-Provider-Signature": signature}
    )


def test_late_error_callback_and_stale_negative_lookup_cannot_undo_a_verified_completion(
    settle: Settle, make_provider: Any
) -> None:
    provider = make_provider("sqlite", lease_seconds=1, secret=SECRET)
    key = "late-signals"
    fencing_token = released_from_evidence(settle, provider, key)
    settled = operation(key)
    assert (settled.state, settled.recovered) == ("released", True)
    match = Evidence.objects.filter(operation__key=key).last()
    assert match is not None
    assert match.verdict == Verdict.MATCH
    assert stale_signals(key) == []

    # (a) A delayed provider error, correctly signed, with a higher sequence than any seen.
    late_error = {
        "operation_key": key,
        "status": "failed",
        "params_digest": digest_of(PARAMS),
        "reference": "ord-1",
        "sequence": 7,
    }
    status, body = signed_callback(settle, provider.name, late_error, secret="wrong-secret")
    assert (status, body["error"]) == (401, "bad_signature")
    status, body = signed_callback(settle, provider.name, late_error)
    assert status == 200, body
    assert body == {"applied": False, "state": "released", "reason": "settled"}

    # (b) A stale negative lookup: the provider's record is (no longer) there.
    with contextlib.closing(sqlite3.connect(provider.path)) as connection, connection:
        connection.execute("DELETE FROM receipts WHERE operation_key = ?", (key,))
        connection.execute("DELETE FROM orders WHERE operation_key = ?", (key,))
    looked_up = operation_lookup(
        operation=operation(key), trigger=LookupAttempt.Trigger.TASK, actor=Actor.system("sweeper")
    )
    assert looked_up.state == "released"
    assert last_verdict(key) == Verdict.ABSENT
    # A resume afterwards still answers from the verified completion.
    assert settle.resume(key, worker="w3") == {
        "decision": "released",
        "state": "released",
        "recovered": True,
    }

    # (c) The dead worker's late report (same fencing token), saying it failed.
    status, body = settle.host.post(
        f"/api/v1/operations/{key}/result", {"fencing_token": fencing_token, "outcome": "failed"}
    )
    assert status == 200, body
    assert body == {"applied": False, "state": "released", "receipt": "succeeded"}

    after = operation(key)
    assert (after.state, after.version, after.recovered) == (
        settled.state,
        settled.version,
        settled.recovered,
    )
    assert after.last_callback_sequence == settled.last_callback_sequence
    receipt = Dispatch.objects.get(operation__key=key)
    assert (receipt.receipt_status, receipt.receipt_recovered, receipt.receipt_evidence_id) == (
        "succeeded",
        True,
        match.pk,
    )
    assert stale_signals(key) == [
        "callback_after_settlement",
        "evidence_after_settlement",
        "duplicate_report",
    ]
    signals = AuditEvent.objects.filter(operation_key=key, kind="stale_signal").order_by("seq")
    assert all(event.data["state"] == "released" for event in signals)
    assert all(event.data["version"] == settled.version for event in signals)
    assert not AuditEvent.objects.filter(
        operation_key=key, kind="transition", seq__gt=signals[0].seq
    ).exists()
    assert permit_events(key, "consumed") == 1
    assert_audit_intact()
