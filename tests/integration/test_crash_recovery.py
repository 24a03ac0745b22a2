"""Workers killed with SIGKILL at precise points, and fresh processes resuming after them.

Each worker is a real OS process (``tests/procs/worker.py``) talking to the live server
over HTTP. The provider leases are one second and the tests wait for them to lapse in
real time. Fresh resuming workers are started with the same effect configuration as the
dead one, so a wrong ``dispatch`` decision would really perform a second effect. They
poll resume as a host does, honouring ``retry_after``: resume queues the lookup, a real
Celery worker (``lookup_worker``) reads the provider, and the next resume answers from
what it found.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from audit.models import AuditEvent
from harness.providers import (
    digest_of,
    http_provider_control,
    journal_append,
    journal_checksum,
    sqlite_provider_commit,
    sqlite_provider_tamper,
)
from recovery.models import Dispatch, Evidence, LookupAttempt, Verdict
from tests.support.flow import PARAMS, lookup_due
from tests.support.live import (
    Procs,
    ProviderHandle,
    Settle,
    assert_audit_intact,
    assert_one_dispatch_one_consumption,
    assert_recovered_receipt,
    crash,
    last_verdict,
    operation,
    permit_events,
    permit_of,
    wait_lease_lapsed,
)

pytestmark = [
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("lookup_worker"),
]

ADAPTERS = ("sqlite", "journal", "http")


# What resume answers when it has just queued a lookup for the background worker.
LOOKING_UP = {"decision": "in_progress", "state": "unknown", "recovered": False, "retry_after": 1}


def fresh_resume(procs: Procs, key: str, provider: ProviderHandle) -> list[dict[str, Any]]:
    """A new process resumes and polls until settled; every answer, the settled one last.

    It would perform the effect again if told to dispatch.
    """
    worker = procs.start(key=key, provider=provider, extra=["--poll-seconds", "15"])
    worker.assert_clean_exit()
    last = worker.wait_for("settled")
    assert last["status"] == 200, last
    if last["body"]["decision"] != "dispatch":
        assert "effect_committed" not in worker.event_names()
    return [event["body"] for event in worker.events if event["event"] == "answer"]


def settled(answers: list[dict[str, Any]]) -> dict[str, Any]:
    """The last answer, without its ``retry_after`` (asserted positive if there is one)."""
    answer = dict(answers[-1])
    retry_after = answer.pop("retry_after", None)
    assert retry_after is None or retry_after >= 1, answers
    return answer


def assert_settled_by_the_background_lookup(key: str) -> None:
    """Its latest lookup was one resume queued, and the background worker ran it to the end."""
    attempt = LookupAttempt.objects.filter(operation__key=key).latest("pk")
    assert (attempt.trigger, attempt.status) == ("resume", "finished")
    assert attempt.evidence == Evidence.objects.filter(operation__key=key).last()


# -- 1. commit, then die ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ADAPTERS)
def test_commit_then_die_is_released_from_evidence_without_a_second_effect(
    kind: str, settle: Settle, procs: Procs, make_provider: Any
) -> None:
    provider = make_provider(kind, lease_seconds=1)
    key = f"crash-commit-{kind}"
    settle.approved(key, provider.name)

    crash(procs, key, provider, "after_effect")
    assert provider.effects(key) == 1
    wait_lease_lapsed(key)

    answers = fresh_resume(procs, key, provider)

    assert answers[0] == LOOKING_UP
    assert answers[-1] == {"decision": "released", "state": "released", "recovered": True}
    assert provider.effects(key) == 1
    assert_one_dispatch_one_consumption(key)
    assert_recovered_receipt(key)
    assert_settled_by_the_background_lookup(key)
    assert LookupAttempt.objects.filter(operation__key=key).count() == 1
    record = settle.record(key)
    assert record["receipt"]["recovered"] is True
    assert record["receipt"]["evidence_id"] == record["evidence"][-1]["evidence_id"]
    assert record["receipt"]["provider_reference"] == f"ref-{key}"
    assert_audit_intact()


# -- 2. die before the provider commits ----------------------------------------------------


@pytest.mark.parametrize("kind", ADAPTERS)
def test_death_before_commit_is_unknown_then_reconcile_and_never_released(
    kind: str, settle: Settle, procs: Procs, make_provider: Any
) -> None:
    budget = 2  # inconclusive lookups before reconcile
    provider = make_provider(kind, lease_seconds=1, lookup_budget=budget)
    key = f"crash-early-{kind}"
    settle.approved(key, provider.name)

    crash(procs, key, provider, "before_effect")
    wait_lease_lapsed(key)

    decisions = []
    for _ in range(budget):
        answers = fresh_resume(procs, key, provider)
        assert answers[0] == LOOKING_UP
        # The lookup found nothing: the answer is what is known, until its back-off ends.
        assert answers[-1]["retry_after"] >= 1, answers
        decisions.append(answers[-1]["decision"])
        lookup_due(key)
    assert decisions == ["unknown"] * (budget - 1) + ["reconcile"]
    op = operation(key)
    assert (op.state, op.recovered, op.lookups_inconclusive) == ("reconcile", False, budget)
    assert op.lookups.count() == budget
    assert set(op.lookups.values_list("trigger", "status")) == {("resume", "finished")}

    # Its recheck is due, and still nothing to confirm: it stays with the operator, and
    # nothing is sent again.
    again = fresh_resume(procs, key, provider)
    assert again[0] == {**LOOKING_UP, "state": "reconcile"}
    assert settled(again) == {"decision": "reconcile", "state": "reconcile", "recovered": False}
    assert op.lookups.count() == budget + 1

    assert provider.effects(key) == 0
    assert_one_dispatch_one_consumption(key)
    verdicts = set(Evidence.objects.filter(operation__key=key).values_list("verdict", flat=True))
    assert verdicts == {Verdict.ABSENT}
    assert Dispatch.objects.get(operation__key=key).receipt_status == "running"
    assert not AuditEvent.objects.filter(
        operation_key=key, kind="transition", data__to="released"
    ).exists()
    assert_audit_intact()


# -- 3. wrong or corrupt evidence, then restored ----------------------------------------


def _journal_repair(path: str, key: str) -> None:
    """The provider repairs its journal: damaged lines for ``key`` are dropped."""
    journal = Path(path)
    kept = []
    for line in journal.read_text("utf-8").splitlines():
        record = json.loads(line)
        if record.get("operation_key") == key and record.get("checksum") != journal_checksum(
            record
        ):
            continue
        kept.append(line)
    journal.write_text("".join(f"{line}\n" for line in kept), "utf-8")


DAMAGE = {
    # name: (adapter, extra worker args, expected verdict)
    "sqlite_other_params": ("sqlite", [], Verdict.MISMATCH),
    "sqlite_order_without_receipt": ("sqlite", [], Verdict.CORRUPT),
    "journal_bad_checksum": ("journal", ["--corrupt-checksum"], Verdict.CORRUPT),
    "http_bad_signature": ("http", [], Verdict.CORRUPT),
}


def _damage(damage: str, provider: ProviderHandle, key: str) -> None:
    if damage == "sqlite_other_params":
        sqlite_provider_tamper(provider.path, key, "other_params", params={**PARAMS, "to": "x"})
    elif damage == "sqlite_order_without_receipt":
        sqlite_provider_tamper(provider.path, key, "delete_receipt")
    elif damage == "http_bad_signature":
        http_provider_control(provider.url, "bad_signature")
    # journal_bad_checksum: the dying worker wrote the damaged line itself.


def _restore(damage: str, provider: ProviderHandle, key: str) -> None:
    if damage.startswith("sqlite"):
        sqlite_provider_commit(
            provider.path, operation_key=key, params=PARAMS, reference=f"ref-{key}"
        )
    elif damage == "journal_bad_checksum":
        _journal_repair(provider.path, key)
    else:
        http_provider_control(provider.url, "normal")


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_wrong_or_corrupt_evidence_never_releases_until_valid_evidence_is_restored(
    damage: str, settle: Settle, procs: Procs, make_provider: Any
) -> None:
    kind, worker_args, verdict = DAMAGE[damage]
    provider = make_provider(kind, lease_seconds=1)
    key = f"crash-{damage.replace('_', '-')}"
    settle.approved(key, provider.name)

    crash(procs, key, provider, "after_effect", *worker_args)
    _damage(damage, provider, key)
    wait_lease_lapsed(key)

    answers = fresh_resume(procs, key, provider)
    assert answers[0] == LOOKING_UP
    assert settled(answers) == {"decision": "reconcile", "state": "reconcile", "recovered": False}
    assert last_verdict(key) == verdict
    assert_settled_by_the_background_lookup(key)
    assert Dispatch.objects.get(operation__key=key).receipt_status == "running"

    if damage == "journal_bad_checksum":
        # A sound line with a higher seq does not outvote a damaged line for the same key
        # (the damaged line's own seq cannot be trusted): still not released.
        journal_append(
            provider.path,
            operation_key=key,
            params_digest=digest_of(PARAMS),
            reference=f"ref-{key}",
        )
        lookup_due(key)
        again = fresh_resume(procs, key, provider)
        assert again[0]["decision"] == "in_progress", again  # looked up again
        assert settled(again) == {"decision": "reconcile", "state": "reconcile", "recovered": False}
        assert_settled_by_the_background_lookup(key)
        assert last_verdict(key) == verdict

    _restore(damage, provider, key)
    lookup_due(key)
    answers = fresh_resume(procs, key, provider)

    assert answers[0] == {**LOOKING_UP, "state": "reconcile"}
    assert answers[-1] == {"decision": "released", "state": "released", "recovered": True}
    assert provider.effects(key) == 1
    assert_one_dispatch_one_consumption(key)
    assert_recovered_receipt(key)
    assert_settled_by_the_background_lookup(key)
    assert_audit_intact()


# -- 5. revocation after the effect committed --------------------------------------------


def test_revoking_after_a_committed_effect_changes_nothing_and_resume_still_confirms(
    settle: Settle, procs: Procs, make_provider: Any
) -> None:
    provider = make_provider("sqlite", lease_seconds=1)
    key = "crash-revoke"
    permit_id = settle.approved(key, provider.name)

    crash(procs, key, provider, "after_effect")
    status, body = settle.approver.post(
        f"/api/v1/permits/{permit_id}/revoke", {"reason": "customer changed their mind"}
    )
    assert status == 200, body
    assert body == {"permit_id": permit_id, "status": "consumed", "revoked": False}
    assert operation(key).state == "dispatched"
    wait_lease_lapsed(key)

    answers = fresh_resume(procs, key, provider)

    assert answers[0] == LOOKING_UP
    assert answers[-1] == {"decision": "released", "state": "released", "recovered": True}
    assert provider.effects(key) == 1
    assert_one_dispatch_one_consumption(key)
    assert_recovered_receipt(key)
    assert_settled_by_the_background_lookup(key)
    assert permit_events(key, "revoke_ignored") == 1
    assert permit_events(key, "revoked") == 0
    assert permit_of(key).revoked_at is None
    assert AuditEvent.objects.filter(operation_key=key, kind="permit_revoke_ignored").count() == 1
    history = [event["kind"] for event in settle.record(key)["permit"]["history"]]
    assert history == ["issued", "consumed", "revoke_ignored"]
    assert_audit_intact()
