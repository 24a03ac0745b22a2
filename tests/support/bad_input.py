"""The bad-input suite's harness: a small world, its endpoints, and a snapshot of every table.

Each bad-input test (tests/recovery/bad_input) builds the same small world (an operation
dispatched, one with a pending approval, one at a signed HTTP provider), snapshots every
table the API can write, sends one bad request and checks the answer and that the snapshot
did not move, except where the project deliberately records a refusal, and then exactly
that record was added.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from _pytest.mark.structures import ParameterSet
from django.conf import settings
from django.test import Client

from approvals.models import Approval, Permit, PermitEvent
from audit.models import AuditEvent
from harness.providers import digest_of
from recovery.models import Dispatch, Evidence, LookupAttempt, Operation
from tests.support.flow import PARAMS, Api

SECRET = "s3cret"
DIGEST = digest_of(PARAMS)
MAX_BODY = settings.DATA_UPLOAD_MAX_MEMORY_SIZE


# -- the snapshot: nothing half-written ------------------------------------------------

TABLES: dict[str, Any] = {
    "Operation": Operation,
    "Approval": Approval,
    "Permit": Permit,
    "PermitEvent": PermitEvent,
    "Dispatch": Dispatch,
    "Evidence": Evidence,
    "LookupAttempt": LookupAttempt,
    "AuditEvent": AuditEvent,
}


# The columns a request could change on a row that already exists.
MUTABLE: dict[str, tuple[Any, tuple[str, ...]]] = {
    "Operation": (
        Operation,
        (
            "state",
            "version",
            "recovered",
            "lookups_inconclusive",
            "last_callback_sequence",
        ),
    ),
    "Approval": (Approval, ("status", "decided_by", "decided_at")),
    "Permit": (Permit, ("status", "consumed_at", "consumed_by", "revoked_at", "revoke_reason")),
    "Dispatch": (
        Dispatch,
        (
            "fencing_token",
            "lease_expires_at",
            "last_heartbeat_at",
            "receipt_status",
            "receipt_reference",
            "receipt_recovered",
            "receipt_reported_at",
        ),
    ),
}


def covering(names: list[str], variants: list[Any]) -> list[Any]:
    """Every variant once and every endpoint once, instead of their cross-product.

    All endpoints go through the same check (the body parser, the content type, the
    bearer token, the method, the key pattern): a variant refused on one endpoint is
    refused on all, and each endpoint is shown to reach that check with one variant.
    """

    def values(variant: Any) -> tuple[Any, ...]:
        if isinstance(variant, ParameterSet):
            return tuple(variant.values)
        return variant if isinstance(variant, tuple) else (variant,)

    def label(variant: Any, number: int) -> str:
        return variant.id if isinstance(variant, ParameterSet) and variant.id else str(number)

    first, *others = names
    cases = [
        pytest.param(first, *values(v), id=f"{first}-{label(v, i)}") for i, v in enumerate(variants)
    ]
    cases += [
        pytest.param(n, *values(variants[0]), id=f"{n}-{label(variants[0], 0)}") for n in others
    ]
    return cases


@dataclass(frozen=True)
class Snapshot:
    counts: dict[str, int]
    rows: dict[str, dict[Any, tuple[Any, ...]]]


def snapshot() -> Snapshot:
    """Row counts of every table the API writes, plus the mutable columns of each row."""
    counts = {name: model.objects.count() for name, model in TABLES.items()}
    rows = {
        name: {row[0]: row[1:] for row in model.objects.values_list("pk", *columns)}
        for name, (model, columns) in MUTABLE.items()
    }
    return Snapshot(counts, rows)


def assert_unchanged(before: Snapshot) -> None:
    after = snapshot()
    assert after.counts == before.counts
    assert after.rows == before.rows


def assert_only_recorded(before: Snapshot, **added: int) -> list[AuditEvent]:
    """Exactly ``added`` new rows (by table name), no existing row changed.

    Returns the audit events that were added, oldest first.
    """
    after = snapshot()
    expected = {name: count + added.get(name, 0) for name, count in before.counts.items()}
    assert after.counts == expected
    for name, rows in before.rows.items():
        assert {pk: after.rows[name][pk] for pk in rows} == rows, name
    return list(AuditEvent.objects.order_by("id")[before.counts["AuditEvent"] :])


def assert_error(response: Any, status: int, code: str, /, **extra: Any) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert body["error"] == code, body
    assert isinstance(body["message"], str) and body["message"]
    for name, value in extra.items():
        assert body[name] == value, body
    return body


# -- the world and the endpoints ---------------------------------------------------------


def sign(raw: bytes, secret: str = SECRET) -> str:
    return hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()


@dataclass
class World:
    host: Api
    other_host: Api
    approver: Api
    approval_id: str  # pending, on op-2
    decided_approval_id: str  # approved, on op-1
    permit_id: str  # consumed, of op-1
    fencing_token: str  # holds op-1's dispatch
    client: Client = field(default_factory=Client)

    def token(self, caller: str) -> str:
        return {"host": self.host, "other_host": self.other_host, "approver": self.approver}[
            caller
        ].token

    def send(
        self,
        endpoint: Endpoint,
        raw: bytes | None = None,
        *,
        body: Any = None,
        method: str | None = None,
        content_type: str = "application/json",
        authorization: str | None = "",
        caller: str | None = None,
        signature: str | None = "",
        **path: str,
    ) -> Any:
        """One request; ``""`` means "the right one" for authorization and signature."""
        if raw is None:
            raw = json.dumps(body if body is not None else endpoint.body(self)).encode()
        headers: dict[str, str] = {}
        if endpoint.caller == "signed":
            if signature == "":
                signature = sign(raw)
            if signature is not None:
                headers["HTTP_X_PROVIDER_SIGNATURE"] = signature
        else:
            if authorization == "":
                authorization = f"Bearer {self.token(caller or endpoint.caller)}"
            if authorization is not None:
                headers["HTTP_AUTHORIZATION"] = authorization
        return self.client.generic(
            method or endpoint.method,
            endpoint.url(self, **path),
            data=raw,
            content_type=content_type,
            **headers,
        )


@dataclass(frozen=True)
class Endpoint:
    name: str
    method: str
    path: str
    caller: str  # "host", "approver" or "signed"
    body: Callable[[World], dict[str, Any]]
    required: tuple[str, ...] = ()
    key: str = "op-1"

    def url(self, world: World, **overrides: str) -> str:
        values = {
            "key": self.key,
            "approval_id": world.approval_id,
            "permit_id": world.permit_id,
            "provider": "hp",
            **overrides,
        }
        return self.path.format(**values)


ENDPOINTS = {
    e.name: e
    for e in [
        Endpoint(
            "register",
            "POST",
            "/api/v1/operations",
            "host",
            lambda w: {
                "key": "op-new",
                "action": "payment.send",
                "provider": "orders",
                "params": {"amount": 1},
            },
            ("key", "action", "provider", "params"),
        ),
        Endpoint(
            "approvals",
            "POST",
            "/api/v1/operations/{key}/approvals",
            "host",
            lambda w: {},
            key="op-2",
        ),
        Endpoint(
            "decision",
            "POST",
            "/api/v1/approvals/{approval_id}/decision",
            "approver",
            lambda w: {
                "decision": "approve",
                "ttl_seconds": 300,
                "params_digest": digest_of(PARAMS),
            },
            ("decision", "params_digest"),
        ),
        Endpoint(
            "revoke",
            "POST",
            "/api/v1/permits/{permit_id}/revoke",
            "host",
            lambda w: {"reason": "no longer wanted"},
            ("reason",),
        ),
        Endpoint(
            "dispatch",
            "POST",
            "/api/v1/operations/{key}/dispatch",
            "host",
            lambda w: {"worker": "w9", "params_digest": DIGEST},
            ("worker", "params_digest"),
        ),
        Endpoint(
            "heartbeat",
            "POST",
            "/api/v1/operations/{key}/heartbeat",
            "host",
            lambda w: {"fencing_token": w.fencing_token},
            ("fencing_token",),
        ),
        Endpoint(
            "result",
            "POST",
            "/api/v1/operations/{key}/result",
            "host",
            lambda w: {
                "fencing_token": w.fencing_token,
                "outcome": "committed",
                "provider_reference": "ord-1",
            },
            ("fencing_token", "outcome"),
        ),
        Endpoint(
            "resume",
            "POST",
            "/api/v1/operations/{key}/resume",
            "host",
            lambda w: {"worker": "w9"},
            ("worker",),
        ),
        Endpoint("operation", "GET", "/api/v1/operations/{key}", "host", lambda w: {}),
        Endpoint(
            "callbacks",
            "POST",
            "/api/v1/providers/{provider}/callbacks",
            "signed",
            lambda w: {
                "operation_key": "op-h",
                "status": "committed",
                "params_digest": DIGEST,
                "reference": "ref-1",
                "sequence": 1,
            },
            ("operation_key", "status", "params_digest", "reference", "sequence"),
        ),
    ]
}
POSTS = [name for name, e in ENDPOINTS.items() if e.method == "POST"]
WITH_FIELDS = [name for name, e in ENDPOINTS.items() if e.required]
BEARER = [name for name, e in ENDPOINTS.items() if e.caller != "signed"]
HOST_ONLY = ["register", "approvals", "dispatch", "heartbeat", "result", "resume", "operation"]
BY_KEY = ["approvals", "dispatch", "heartbeat", "result", "resume", "operation"]


def with_duplicate(body: dict[str, Any]) -> bytes:
    """The body's JSON text with its first member written twice."""
    name, value = next(iter(body.items()))
    member = f"{json.dumps(name)}: {json.dumps(value)}"
    return ("{" + member + ", " + json.dumps(body)[1:]).encode()
