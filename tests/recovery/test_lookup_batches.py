"""Background lookups in batches: one read of the provider per batch, few statements,
and each operation still judged, and refused, on its own."""

from __future__ import annotations

import builtins
import json
import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from audit.models import AuditEvent
from audit.verify_walk import audit_verify
from harness.providers import (
    digest_of,
    journal_append,
    journal_append_raw,
    sqlite_provider_commit,
)
from recovery.adapters import ProviderConfig, evidence_lookup, evidence_lookup_many, sqlite_orders
from recovery.adapters import journal as journal_adapter
from recovery.models import Dispatch, Evidence, LookupAttempt, Operation, Provider
from recovery.services import locking, lookup_tasks, lookups
from recovery.services.lookup_tasks import lookup_batch_run
from recovery.services.sweep import sweep
from tests.support.flow import PARAMS

pytestmark = pytest.mark.django_db

DIGEST = digest_of(PARAMS)


def _crashed(flow: Any, keys: list[str]) -> None:
    for key in keys:
        flow.approved(key)
        assert flow.dispatch(key).status_code == 200
    Dispatch.objects.update(lease_expires_at=timezone.now() - timedelta(seconds=1))


def _batches() -> list[list[int]]:
    published: list[list[int]] = []
    sweep(publish_batch=published.append)
    return published


def _journal_provider(provider: Provider, path: Path, keys: list[str]) -> None:
    """The operations' provider keeps a journal instead, one committed line per key."""
    for key in keys:
        journal_append(path, operation_key=key, params_digest=DIGEST, reference=f"r-{key}")
    for n in range(50):  # and lines of operations settled long ago
        journal_append(path, operation_key=f"old-{n}", params_digest=DIGEST, reference="old")
    Provider.objects.filter(pk=provider.pk).update(adapter="journal", path=str(path))


def test_a_batch_reads_the_journal_once_and_releases_every_operation(
    flow: Any, provider: Provider, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = [f"op-{n}" for n in range(6)]
    _crashed(flow, keys)
    journal = tmp_path / "journal.jsonl"
    _journal_provider(provider, journal, keys)
    reads: list[str] = []

    def counting_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        reads.append(str(path))
        return builtins.open(path, *args, **kwargs)

    monkeypatch.setattr(journal_adapter, "open", counting_open, raising=False)
    [batch] = _batches()
    outcome = lookup_batch_run(attempt_ids=batch)

    assert sorted(outcome.looked_up) == sorted(batch) and len(batch) == len(keys)
    assert reads == [str(journal)]
    assert set(Operation.objects.values_list("state", flat=True)) == {"released"}
    assert Dispatch.objects.filter(receipt_recovered=True).count() == len(keys)
    assert set(LookupAttempt.objects.values_list("status", flat=True)) == {"finished"}
    assert list(audit_verify()) == []


def test_a_batch_queries_a_sqlite_provider_once(
    flow: Any, provider_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = [f"op-{n}" for n in range(5)]
    _crashed(flow, keys)
    for key in keys:
        sqlite_provider_commit(provider_db, operation_key=key, params=PARAMS, reference=key)
    connects: list[str] = []
    real_connect = sqlite3.connect

    def counting_connect(*args: Any, **kwargs: Any) -> Any:
        connects.append(args[0])
        return real_connect(*args, **kwargs)

    monkeypatch.setattr(sqlite_orders.sqlite3, "connect", counting_connect)
    [batch] = _batches()
    lookup_batch_run(attempt_ids=batch)

    assert len(connects) == 1
    assert set(Operation.objects.values_list("state", flat=True)) == {"released"}


def test_a_stale_row_in_a_batch_is_refused_and_recorded_alone(
    flow: Any, provider_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = ["op-1", "op-2", "op-3"]
    _crashed(flow, keys)
    for key in keys:
        sqlite_provider_commit(provider_db, operation_key=key, params=PARAMS, reference=key)
    [batch] = _batches()
    calls = []
    real_locked = locking.operations_locked_by_id

    def locked_then_moved_on(ids: Any) -> dict[int, Operation]:
        operations = real_locked(ids)
        calls.append(ids)
        if len(calls) == 2:  # applying the answers: op-2 moved on since it was read
            Operation.objects.filter(key="op-2").update(version=F("version") + 1)
        return operations

    # Starting the attempts locks them once, applying the answers once more.
    monkeypatch.setattr(lookup_tasks, "operations_locked_by_id", locked_then_moved_on)
    monkeypatch.setattr(lookups, "operations_locked_by_id", locked_then_moved_on)
    lookup_batch_run(attempt_ids=batch)

    states = dict(Operation.objects.values_list("key", "state"))
    assert states == {"op-1": "released", "op-2": "unknown", "op-3": "released"}
    [refusal] = AuditEvent.objects.filter(kind="stale_signal", data__signal="transition_refused")
    assert refusal.operation_key == "op-2"
    assert refusal.data["event"] == "evidence_match"
    assert refusal.data["reason"] == "stale (state, version)"
    assert Evidence.objects.filter(operation__key="op-2").count() == 1  # on the record
    assert not Dispatch.objects.get(operation__key="op-2").receipt_recovered


def test_an_attempt_held_by_a_live_lease_is_left_for_a_retry_and_the_others_run(
    flow: Any, provider_db: Path
) -> None:
    keys = ["op-1", "op-2"]
    _crashed(flow, keys)
    for key in keys:
        sqlite_provider_commit(provider_db, operation_key=key, params=PARAMS, reference=key)
    [batch] = _batches()
    held = LookupAttempt.objects.get(operation__key="op-1")
    LookupAttempt.objects.filter(pk=held.pk).update(
        status="running", lease_expires_at=timezone.now() + timedelta(seconds=30)
    )

    outcome = lookup_batch_run(attempt_ids=batch)

    assert outcome.retry_ids == [held.pk] and 1 <= outcome.retry_in <= 31
    assert outcome.looked_up == [pk for pk in batch if pk != held.pk]
    states = dict(Operation.objects.values_list("key", "state"))
    assert states == {"op-1": "unknown", "op-2": "released"}


def test_statements_per_settled_operation_stay_bounded(
    flow: Any, provider_db: Path, settings: Any
) -> None:
    """Sweep and batch together: a few statements per operation, not ~20 each."""
    keys = [f"op-{n}" for n in range(30)]
    _crashed(flow, keys)
    for key in keys:
        sqlite_provider_commit(provider_db, operation_key=key, params=PARAMS, reference=key)
    with CaptureQueriesContext(connection) as queries:
        batches = _batches()
        for batch in batches:
            lookup_batch_run(attempt_ids=batch)
    assert set(Operation.objects.values_list("state", flat=True)) == {"released"}
    per_operation = len(queries.captured_queries) / len(keys)
    print(f"\n{per_operation:.1f} statements per settled operation")
    assert per_operation <= 6


def test_the_beat_sweep_publishes_one_message_per_provider_batch(flow: Any, settings: Any) -> None:
    settings.SETTLE_LOOKUP_BATCH = 2
    _crashed(flow, ["op-1", "op-2", "op-3"])
    batches = _batches()
    assert [len(batch) for batch in batches] == [2, 1]


# -- the batch adapter judges each key as the single lookup does ---------------------------


def test_a_journal_batch_answers_each_key_exactly_as_a_single_lookup(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    other = digest_of({"amount": 1})
    journal_append(path, operation_key="match", params_digest=DIGEST, reference="m")
    journal_append(path, operation_key="mismatch", params_digest=other, reference="x")
    journal_append(path, operation_key="bad-sum", params_digest=DIGEST, reference="b")
    journal_append(
        path, operation_key="bad-sum", params_digest=DIGEST, reference="b", corrupt_checksum=True
    )
    journal_append_raw(path, '{"operation_key": "broken", "seq": ')
    journal_append(path, operation_key="twice", params_digest=DIGEST, reference="t1", seq=90)
    journal_append(path, operation_key="twice", params_digest=DIGEST, reference="t2", seq=90)
    journal_append(path, operation_key="mentioned", params_digest=DIGEST, reference='"match"')
    # The key spelled with an escape: found by parsing, not by its text.
    journal_append_raw(path, '{"operation_key": "\\u0065scaped", "seq": 1}')
    journal_append(path, operation_key="newest", params_digest=other, reference="n1", seq=200)
    journal_append(path, operation_key="newest", params_digest=DIGEST, reference="n2", seq=100)
    config = ProviderConfig(adapter="journal", path=str(path))
    keys = [
        "match",
        "mismatch",
        "bad-sum",
        "broken",
        "twice",
        "mentioned",
        "escaped",
        "newest",
        "absent",
    ]

    batch = evidence_lookup_many(config=config, wanted=dict.fromkeys(keys, DIGEST))

    for key in keys:
        single = evidence_lookup(config=config, operation_key=key, params_digest=DIGEST)
        assert batch[key] == single, key
    verdicts = {key: batch[key].verdict for key in keys}
    assert verdicts == {
        "match": "match",
        "mismatch": "mismatch",
        "bad-sum": "corrupt",
        "broken": "corrupt",
        "twice": "corrupt",
        "mentioned": "match",
        "escaped": "corrupt",
        "newest": "mismatch",
        "absent": "absent",
    }


def test_a_missing_journal_makes_every_key_of_the_batch_unavailable(tmp_path: Path) -> None:
    config = ProviderConfig(adapter="journal", path=str(tmp_path / "missing.jsonl"))
    batch = evidence_lookup_many(config=config, wanted={"a": DIGEST, "b": DIGEST})
    assert {result.verdict for result in batch.values()} == {"unavailable"}


@given(
    line=st.text(alphabet='"a:é ,{}', max_size=40),
    keys=st.lists(st.text(alphabet='"a:é', max_size=4), min_size=1, max_size=5, unique=True),
)
def test_a_line_without_backslashes_mentions_the_same_keys_by_either_reading(
    line: str, keys: list[str]
) -> None:
    """The set-intersection reading of a plain line finds exactly what the scan finds."""
    needles: dict[bytes, str] = {}
    for key in keys:
        needles[json.dumps(key).encode()] = key
        needles[json.dumps(key, ensure_ascii=False).encode()] = key
    literal = {needle[1:-1]: key for needle, key in needles.items() if b"\\" not in needle}
    longest = max(len(needle) for needle in needles)
    encoded = line.encode()
    assert journal_adapter._mentioned_literally(encoded, literal) == journal_adapter._mentioned(
        encoded, needles, longest
    )
