"""The model the machine predicts from: its sizes, its constants, each operation's state."""

from __future__ import annotations

import os
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from common.actors import Actor
from harness.providers import (
    SQLITE_TAMPER_MODES,
    digest_of,
)
from recovery.models import (
    Dispatch,
    State,
    Verdict,
)
from recovery.services.errors import RecoveryError
from recovery.services.resume import Decision

EXAMPLES = int(os.environ.get("SETTLE_HYPOTHESIS_EXAMPLES", "60"))
STEPS = int(os.environ.get("SETTLE_HYPOTHESIS_STEPS", "30"))
# Refusals of one reason on one permit recorded one by one (a run reaches it).
REFUSALS_RECORDED = 2
# Shrinking a failure replays whole examples against the database and can take minutes;
# SETTLE_HYPOTHESIS_SHRINK=0 reports the first failing sequence as found.
SHRINK = os.environ.get("SETTLE_HYPOTHESIS_SHRINK", "1") != "0"

KEYS = ("op-a", "op-b", "op-c")
WORKERS = ("w1", "w2", "w3")
ACTION = "payment.send"
PROVIDER = "orders"
LOOKUP_BUDGET = 3
TTL_SECONDS = 300
FLEET = Actor("host", "1", "fleet-a")
OTHER_PARAMS = {"amount": 1, "currency": "EUR", "to": "acct-mallory"}
TAMPERED_PARAMS = {"tampered": True}  # what sqlite_provider_tamper writes for other_params
BROKEN_DIGEST = "sha256:" + "0" * 64  # what it writes for wrong_stored_digest
# Tokens a host may present that were never handed out, ASCII and not. A non-ASCII token
# must be refused as stale_fencing_token like any other; hmac.compare_digest raises
# TypeError on non-ASCII str, so _dispatch_for_token has to compare bytes (or refuse first).
FORGED_TOKENS = ("forged-token", "", "x" * 64, "tökén-forgé")
# How far each key gets before the random steps start.
HEAD_STARTS = (
    "registered",
    "approved",
    "dispatched",
    "performed",
    "crashed",
    "uncertain",
    "stranded",
    "queued",
    "resumed",
    "escalated",
)
UNREGISTERED_KEY = "op-never-registered"

COMMITTED = "committed"
FAILED_STATUS = "failed"
RUNNING = Dispatch.ReceiptStatus.RUNNING.value
SUCCEEDED = Dispatch.ReceiptStatus.SUCCEEDED.value
RECEIPT_FAILED = Dispatch.ReceiptStatus.FAILED.value

ANSWERS = {
    State.RELEASED: Decision.RELEASED,
    State.UNKNOWN: Decision.UNKNOWN,
    State.RECONCILE: Decision.RECONCILE,
    State.AWAITING_APPROVAL: Decision.WAIT,
    State.DISPATCHED: Decision.IN_PROGRESS,
}


DAMAGE_MODES = [mode for mode in SQLITE_TAMPER_MODES if mode != "huge_created_at"]


def params_for(key: str) -> dict[str, Any]:
    return {"amount": 1000 + KEYS.index(key), "currency": "EUR", "to": f"acct-{key}"}


def answer_for(state: str) -> str:
    return ANSWERS.get(State(state), Decision.CLOSED)


@dataclass
class Record:
    """The provider's orders + receipts rows for one key, as the model believes them."""

    params: dict[str, Any]
    status: str
    reference: str
    order_status: str | None  # None: no order row
    receipt: tuple[str | None, str] | None  # (digest of params_json or None, stored digest)

    @classmethod
    def performed(cls, params: dict[str, Any], status: str, reference: str) -> Record:
        digest = digest_of(params)
        return cls(params, status, reference, status, (digest, digest))

    @property
    def damaged(self) -> bool:
        digest = digest_of(self.params)
        return self.order_status != self.status or self.receipt != (digest, digest)

    def verdict(self, expected_digest: str) -> tuple[str, str]:
        """What ``evidence_lookup`` must say about these rows: (verdict, provider_status)."""
        if self.order_status is None and self.receipt is None:
            return Verdict.ABSENT, ""
        if self.order_status is None or self.receipt is None:
            return Verdict.CORRUPT, ""
        if self.order_status not in (COMMITTED, FAILED_STATUS):
            return Verdict.CORRUPT, ""
        json_digest, stored = self.receipt
        if json_digest is None or json_digest != stored:
            return Verdict.CORRUPT, ""
        if stored != expected_digest:
            return Verdict.MISMATCH, self.order_status
        return Verdict.MATCH, self.order_status

    def tamper(self, mode: str) -> bool:
        """Apply ``mode`` to the model; False if the provider has no row to damage."""
        needs_order = mode in ("delete_order", "bad_status")
        if (self.order_status is None) if needs_order else (self.receipt is None):
            return False
        if mode == "delete_receipt":
            self.receipt = None
        elif mode == "delete_order":
            self.order_status = None
        elif mode == "bad_status":
            self.order_status = "pending"
        else:
            assert self.receipt is not None
            json_digest, stored = self.receipt
            if mode == "bad_json":
                self.receipt = (None, stored)
            elif mode == "wrong_stored_digest":
                self.receipt = (json_digest, BROKEN_DIGEST)
            else:  # other_params
                other = digest_of(TAMPERED_PARAMS)
                self.receipt = (other, other)
        return True


@dataclass
class OpModel:
    """What the model expects of one operation key."""

    key: str
    params: dict[str, Any]
    digest: str
    registered: bool = False
    state: str = ""
    version: int = 0
    recovered: bool = False
    history: list[str] = field(default_factory=list)
    pending_approval: uuid.UUID | None = None
    decided_approvals: list[uuid.UUID] = field(default_factory=list)
    permit_id: uuid.UUID | None = None
    permit_status: str | None = None
    permit_past_expiry: bool = False
    permit_was_consumed: bool = False
    token: str | None = None
    tokens_issued: int = 0
    worker_alive: bool = False
    lease_lapsed: bool = False
    receipt: str | None = None
    receipt_recovered: bool = False
    record: Record | None = None
    effects: int = 0
    inconclusive: int = 0
    last_sequence: int | None = None
    evidence: list[tuple[str, str]] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)  # lines of the permit's history
    # Refusals past REFUSALS_RECORDED of a reason, counted in its summary line.
    counted: Counter[str] = field(default_factory=Counter)
    consume_refused: int = 0  # audit events: every refusal without a permit, and each line
    release_cause: str = ""
    lookup_queued: int | None = None  # the attempt waiting for its task (one at most)
    lookup_trigger: str = ""  # who queued it: the sweeper ("task") or resume ("resume")
    lookups_run: list[int] = field(default_factory=list)  # background attempts done

    def move(self, to: str) -> None:
        self.state = to
        self.version += 1
        self.history.append(to)


class Refused:
    """Expect ``RecoveryError`` with ``code`` from the block; anything else propagates."""

    def __init__(self, code: str) -> None:
        self.code = code

    def __enter__(self) -> Refused:
        return self

    def __exit__(self, kind: Any, value: Any, tb: Any) -> bool:
        assert kind is not None, f"expected a {self.code!r} refusal, the call succeeded"
        if not issubclass(kind, RecoveryError):
            return False  # not a refusal: a bug, let it fail the test
        assert value.code == self.code, f"expected {self.code!r}, got {value.code!r}"
        return True


@dataclass
class Facts:
    """One read of the database (and the provider's file) after a step."""

    operations: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    permits: dict[uuid.UUID, tuple[str, str, str]] = field(default_factory=dict)
    dispatches: list[tuple[str, uuid.UUID]] = field(default_factory=list)
    receipts: dict[str, tuple[str, bool, int | None]] = field(default_factory=dict)
    refused: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    counted: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    consumed: Counter[uuid.UUID] = field(default_factory=Counter)
    events: list[tuple[int, str, str, Any, str]] = field(default_factory=list)
    kinds: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    transitions: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    committed_reports: Counter[str] = field(default_factory=Counter)
    evidence: dict[int, tuple[str, str, str]] = field(default_factory=dict)
    provider_rows: Counter[tuple[str, str]] = field(default_factory=Counter)
