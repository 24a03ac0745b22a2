"""Bad input at every endpoint: a stable error code, JSON, never a 500, nothing half-written.

Each test builds the same small world (an operation dispatched, one with a pending
approval, one at a signed HTTP provider), snapshots every table the API can write, sends
one bad request and checks the answer and that the snapshot did not move — except where
the project deliberately records a refusal, and then exactly that record was added.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
import rfc8785
from _pytest.mark.structures import ParameterSet
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone
from guardian.shortcuts import assign_perm

from approvals.models import Approval, Permit, PermitEvent
from audit.models import AuditEvent
from common.canonical import MAX_PARAMS_BYTES, MAX_SAFE_INTEGER
from recovery.models import Dispatch, Evidence, LookupAttempt, Operation, Provider
from recovery.permissions import ProviderPermission
from recovery.services.providers import provider_configure
from tests.support.flow import PARAMS, Api
from tests.support.providers import digest_of

pytestmark = pytest.mark.django_db

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


@pytest.fixture
def world(flow, host_api, other_host_api, approver_api) -> World:
    decided = flow.approved("op-1")
    decided_approval_id = decided["approval_id"]
    dispatched = flow.dispatch("op-1")
    assert dispatched.status_code == 200, dispatched.content
    flow.register("op-2")
    opened = host_api.post("/api/v1/operations/op-2/approvals")
    assert opened.status_code == 201, opened.content
    provider_configure(name="hp", adapter="http", url="http://127.0.0.1:9", secret=SECRET)
    registered = host_api.post(
        "/api/v1/operations",
        {"key": "op-h", "action": "payment.send", "provider": "hp", "params": PARAMS},
    )
    assert registered.status_code == 201, registered.content
    return World(
        host=host_api,
        other_host=other_host_api,
        approver=approver_api,
        approval_id=opened.json()["approval_id"],
        decided_approval_id=decided_approval_id,
        permit_id=decided["permit_id"],
        fencing_token=dispatched.json()["fencing_token"],
    )


def with_duplicate(body: dict[str, Any]) -> bytes:
    """The body's JSON text with its first member written twice."""
    name, value = next(iter(body.items()))
    member = f"{json.dumps(name)}: {json.dumps(value)}"
    return ("{" + member + ", " + json.dumps(body)[1:]).encode()


# -- malformed bodies -------------------------------------------------------------------


MALFORMED = [
    pytest.param(b'{"key": ', "malformed_json", id="truncated"),
    pytest.param(b"{'key': 1}", "malformed_json", id="single-quotes"),
    pytest.param(b'{"a": 1,}', "malformed_json", id="trailing-comma"),
    pytest.param(b'{"a": 1} {"b": 2}', "malformed_json", id="two-documents"),
    pytest.param(b'{"a": "\xff"}', "malformed_json", id="invalid-utf8"),
    pytest.param(b'{"a": 1' + b"0" * 5000 + b"}", "malformed_json", id="5000-digit-integer"),
    pytest.param(b"[]", "invalid_body", id="array"),
    pytest.param(b'[{"a": 1}]', "invalid_body", id="array-of-object"),
    pytest.param(b'"text"', "invalid_body", id="string"),
    pytest.param(b"null", "invalid_body", id="null"),
    pytest.param(b"42", "invalid_body", id="number"),
    pytest.param(b"true", "invalid_body", id="boolean"),
    pytest.param(b'{"a": 1, "a": 1}', "duplicate_key", id="duplicate-key"),
    pytest.param(b'{"a": {"b": 1, "b": 2}}', "duplicate_key", id="nested-duplicate-key"),
    pytest.param(b'{"a": NaN}', "non_finite_number", id="NaN"),
    pytest.param(b'{"a": Infinity}', "non_finite_number", id="Infinity"),
    pytest.param(b'{"a": -Infinity}', "non_finite_number", id="-Infinity"),
    pytest.param(b'{"a": 1e400}', "non_finite_number", id="1e400"),
    pytest.param(b'{"a": -1e400}', "non_finite_number", id="-1e400"),
    pytest.param(b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "too_deep", id="deep"),
]


@pytest.mark.parametrize(("name", "raw", "code"), covering(POSTS, MALFORMED))
def test_a_malformed_body_is_400_with_its_code_and_writes_nothing(world, name, raw, code):
    before = snapshot()
    assert_error(world.send(ENDPOINTS[name], raw), 400, code)
    assert_unchanged(before)


@pytest.mark.parametrize("name", [n for n in POSTS if n != "approvals"])
def test_an_empty_body_is_malformed_json(world, name):
    before = snapshot()
    assert_error(world.send(ENDPOINTS[name], b""), 400, "malformed_json")
    assert_unchanged(before)


def test_the_approvals_endpoint_takes_an_empty_body_or_an_empty_object(world):
    before = snapshot()
    for raw in (b"", b"{}"):
        response = world.send(ENDPOINTS["approvals"], raw)
        assert response.status_code == 200, response.content
        assert response.json() == {
            "approval_id": world.approval_id,
            "status": "pending",
            "permit_id": None,
            "expires_at": None,
            "rule": "",
            "required": 1,
            "approvals": 0,
            "needed": "0 of 1 approvals",
        }
    assert_unchanged(before)


@pytest.mark.parametrize("name", WITH_FIELDS)
def test_a_duplicate_key_in_an_otherwise_valid_body_is_refused(world, name):
    endpoint = ENDPOINTS[name]
    before = snapshot()
    raw = with_duplicate(endpoint.body(world))
    assert_error(world.send(endpoint, raw), 400, "duplicate_key")
    assert_unchanged(before)


@pytest.mark.parametrize(
    ("name", "literal"), covering(WITH_FIELDS, ["NaN", "Infinity", "-Infinity", "1e400"])
)
def test_a_non_finite_number_in_a_field_is_refused(world, name, literal):
    endpoint = ENDPOINTS[name]
    first = endpoint.required[0]
    raw = json.dumps({**endpoint.body(world), first: "@@"}).replace('"@@"', literal).encode()
    before = snapshot()
    assert_error(world.send(endpoint, raw), 400, "non_finite_number")
    assert_unchanged(before)


@pytest.mark.parametrize(
    ("name", "extra"), covering(POSTS, [{"surprise": 1}, {"Key": "op-1"}, {"": None}])
)
def test_an_unknown_field_is_refused_and_named(world, name, extra):
    endpoint = ENDPOINTS[name]
    before = snapshot()
    response = world.send(endpoint, body={**endpoint.body(world), **extra})
    assert_error(response, 400, "unknown_field", fields=sorted(extra))
    assert_unchanged(before)


@pytest.mark.parametrize(
    ("name", "missing"),
    [(name, f) for name in WITH_FIELDS for f in ENDPOINTS[name].required],
)
def test_a_missing_required_field_is_422_and_named(world, name, missing):
    endpoint = ENDPOINTS[name]
    body = {k: v for k, v in endpoint.body(world).items() if k != missing}
    before = snapshot()
    assert_error(world.send(endpoint, body=body), 422, "missing_field", field=missing)
    assert_unchanged(before)


SURROGATE = "\ud800"
NON_ASCII = "\u00e9"
INVALID_VALUES: dict[str, list[tuple[str, Any]]] = {
    "register": [
        ("key", 123),
        ("key", True),
        ("key", None),
        ("key", ["op-1"]),
        ("key", ""),
        ("key", "bad key"),
        ("key", "-leading-dash"),
        ("key", "op-1\n"),
        ("key", "k" * 201),
        ("key", SURROGATE),
        ("action", 1),
        ("action", {"name": "payment.send"}),
        ("action", "payment.send\n"),
        ("action", "x" * 201),
        ("provider", 7),
        ("provider", False),
        ("provider", "orders\x00"),
        ("provider", SURROGATE),
        ("provider", "p" * 101),
    ],
    "decision": [
        ("decision", True),
        ("decision", 1),
        ("decision", None),
        ("decision", "maybe"),
        ("decision", "APPROVE"),
        ("decision", "approve\n"),
        ("ttl_seconds", True),
        ("ttl_seconds", False),
        ("ttl_seconds", "300"),
        ("ttl_seconds", 1.5),
        ("ttl_seconds", 1e308),
        ("ttl_seconds", None),
        ("ttl_seconds", 0),
        ("ttl_seconds", -1),
        ("ttl_seconds", 7 * 24 * 3600 + 1),
        ("ttl_seconds", 2**64),
    ],
    "revoke": [
        ("reason", 1),
        ("reason", True),
        ("reason", None),
        ("reason", ["why"]),
        ("reason", "x" * 501),
        ("reason", "a\x00b"),
        ("reason", SURROGATE),
        ("reason", "ok " + "\udfff"),
    ],
    "dispatch": [
        ("worker", 1),
        ("worker", True),
        ("worker", ""),
        ("worker", "w1\n"),
        ("worker", SURROGATE),
        ("params_digest", 1),
        ("params_digest", False),
        ("params_digest", None),
        ("params_digest", DIGEST + "0"),
        ("params_digest", "a\x00"),
        ("params_digest", SURROGATE),
    ],
    "heartbeat": [
        ("fencing_token", 1),
        ("fencing_token", True),
        ("fencing_token", None),
        ("fencing_token", ""),
        ("fencing_token", NON_ASCII),
        ("fencing_token", SURROGATE),
        ("fencing_token", "t\x00"),
        ("fencing_token", "t" * 65),
        ("fencing_token", "has space"),
    ],
    "result": [
        ("fencing_token", 1),
        ("fencing_token", NON_ASCII * 10),
        ("fencing_token", SURROGATE),
        ("outcome", "success"),
        ("outcome", 1),
        ("outcome", True),
        ("outcome", None),
        ("provider_reference", 1),
        ("provider_reference", None),
        ("provider_reference", SURROGATE),
        ("provider_reference", "x" * 201),
    ],
    "resume": [
        ("worker", 1),
        ("worker", False),
        ("worker", None),
        ("worker", " w"),
        ("worker", "w\n"),
        ("worker", SURROGATE),
    ],
    "callbacks": [
        ("operation_key", 1),
        ("operation_key", "bad key"),
        ("operation_key", "op-h\n"),
        ("status", "ok"),
        ("status", True),
        ("params_digest", "sha256:xyz"),
        ("params_digest", DIGEST + "\n"),
        ("params_digest", DIGEST.upper()),
        ("params_digest", 1),
        ("reference", 1),
        ("reference", SURROGATE),
        ("reference", "r\x00"),
        ("sequence", True),
        ("sequence", "1"),
        ("sequence", 1.5),
        ("sequence", 2.0**53),
        ("sequence", -1),
        ("sequence", None),
        ("sequence", 2**53),
        ("sequence", 2**63),
    ],
}


@pytest.mark.parametrize(
    ("name", "field_name", "value"),
    [(name, f, v) for name, cases in INVALID_VALUES.items() for f, v in cases],
)
def test_a_wrong_type_or_value_is_422_invalid_field(world, name, field_name, value):
    endpoint = ENDPOINTS[name]
    body = {**endpoint.body(world), field_name: value}
    before = snapshot()
    assert_error(world.send(endpoint, body=body), 422, "invalid_field", field=field_name)
    assert_unchanged(before)


@pytest.mark.parametrize(
    ("name", "field_name", "value"),
    [("decision", "ttl_seconds", 300.0), ("callbacks", "sequence", 1.0)],
)
def test_a_whole_number_written_with_a_fraction_is_that_integer(world, name, field_name, value):
    """JSON has one kind of number: the document's integer (JSON Schema's) includes 300.0."""
    endpoint = ENDPOINTS[name]
    response = world.send(endpoint, body={**endpoint.body(world), field_name: value})
    assert response.status_code == 200, response.content
    if name == "decision":
        permit = Permit.objects.get(pk=response.json()["permit_id"])
        assert permit.expires_at - permit.issued_at == timedelta(seconds=int(value))


@pytest.mark.parametrize("name", WITH_FIELDS)
def test_a_lone_surrogate_as_raw_bytes_is_refused(world, name):
    """CESU-style bytes for U+D800 decode (JSON allows it) to a lone surrogate."""
    endpoint = ENDPOINTS[name]
    text_fields = [k for k, v in endpoint.body(world).items() if isinstance(v, str)]
    target = text_fields[0]
    raw = json.dumps({**endpoint.body(world), target: "@@"}).encode()
    raw = raw.replace(b'"@@"', b'"\xed\xa0\x80"')
    before = snapshot()
    assert_error(world.send(endpoint, raw), 422, "invalid_field", field=target)
    assert_unchanged(before)


@pytest.mark.parametrize(
    ("name", "content_type"),
    covering(
        POSTS,
        [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=xyz",
            "application/xml",
            "application/json-patch+json",
            "application/octet-stream",
        ],
    ),
)
def test_a_wrong_content_type_is_415(world, name, content_type):
    endpoint = ENDPOINTS[name]
    body = endpoint.body(world) or {"surprise": 1}
    raw = json.dumps(body).encode()
    before = snapshot()
    response = world.send(endpoint, raw, content_type=content_type)
    assert_error(response, 415, "unsupported_media_type")
    assert_unchanged(before)


@pytest.mark.parametrize("name", [n for n in POSTS if n != "approvals"])
def test_a_json_content_type_with_a_charset_is_accepted_up_to_the_body_checks(world, name):
    endpoint = ENDPOINTS[name]
    before = snapshot()
    response = world.send(endpoint, b"{}", content_type="application/json; charset=utf-8")
    assert_error(response, 422, "missing_field")
    assert_unchanged(before)


@pytest.mark.parametrize(("name", "size"), covering(POSTS, [MAX_BODY + 1, MAX_BODY * 4]))
def test_a_body_over_the_upload_limit_is_413_body_too_large(world, name, size):
    endpoint = ENDPOINTS[name]
    prefix = json.dumps(endpoint.body(world))[:-1]
    if endpoint.required:
        prefix += ", "
    raw = (prefix + '"pad": "').encode()
    raw += b"x" * (size - len(raw) - 2) + b'"}'
    assert len(raw) == size
    before = snapshot()
    assert_error(world.send(endpoint, raw), 413, "body_too_large")
    assert_unchanged(before)


def test_a_body_just_under_the_upload_limit_reaches_the_field_checks(world):
    endpoint = ENDPOINTS["revoke"]
    raw = b'{"reason": "' + b"x" * (MAX_BODY - 14) + b'"}'
    assert len(raw) == MAX_BODY
    before = snapshot()
    assert_error(world.send(endpoint, raw), 422, "invalid_field", field="reason")
    assert_unchanged(before)


# -- methods, credentials, permissions ----------------------------------------------------


@pytest.mark.parametrize(
    ("name", "method"),
    covering(POSTS, ["GET", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])
    + [pytest.param("operation", m, id=f"operation-{m}") for m in ("POST", "PUT", "DELETE")],
)
def test_a_wrong_method_is_405_with_an_allow_header(world, name, method):
    endpoint = ENDPOINTS[name]
    before = snapshot()
    response = world.send(endpoint, method=method)
    assert response.status_code == 405
    assert response["Allow"] == endpoint.method
    if method != "HEAD":
        assert_error(response, 405, "method_not_allowed")
    assert_unchanged(before)


@pytest.mark.parametrize(
    ("name", "authorization"),
    covering(
        BEARER,
        [
            None,
            "",
            "Bearer",
            "Bearer    ",
            "Basic dXNlcjpwYXNz",
            "Token sth_abc",
            "Bearer garbage",
            "Bearer sth_" + "A" * 43,
            "Bearer sta_" + "A" * 43,
            "Bearer " + "x" * 5000,
            "Bearer \u00e9t\u00e9",
        ],
    ),
)
def test_no_garbage_or_unknown_bearer_token_is_401(world, name, authorization):
    endpoint = ENDPOINTS[name]
    before = snapshot()
    if authorization == "":
        authorization = " "
    response = world.send(endpoint, authorization=authorization)
    assert_error(response, 401, "unauthorized")
    assert_unchanged(before)


@pytest.mark.parametrize("caller", ["host", "other_host"])
def test_a_host_token_may_not_decide_an_approval(world, caller):
    before = snapshot()
    response = world.send(ENDPOINTS["decision"], caller=caller)
    assert_error(response, 403, "forbidden")
    assert_unchanged(before)
    assert Approval.objects.get(pk=world.approval_id).status == "pending"


@pytest.mark.parametrize("name", HOST_ONLY)
def test_an_approver_token_may_not_act_as_a_host(world, name):
    before = snapshot()
    assert_error(world.send(ENDPOINTS[name], caller="approver"), 403, "forbidden")
    assert_unchanged(before)


@pytest.fixture
def console_user(db):
    return get_user_model().objects.create_user(username="carol", password="pw-not-used")


def _console_decision(world: Any, user: Any, *, csrf_checks: bool = False) -> tuple[Client, Any]:
    """A console session posting an approval decision; the client and its answer."""
    client = Client(enforce_csrf_checks=csrf_checks)
    client.force_login(user)
    response = client.post(
        f"/api/v1/approvals/{world.approval_id}/decision",
        data=json.dumps({"decision": "approve", "params_digest": digest_of(PARAMS)}),
        content_type="application/json",
    )
    return client, response


def test_a_console_session_without_its_csrf_token_is_refused(world, console_user):
    before = snapshot()
    _, response = _console_decision(world, console_user, csrf_checks=True)
    assert_error(response, 403, "csrf_failed")
    assert_unchanged(before)


def test_a_console_user_who_may_view_but_not_decide_is_forbidden(world, console_user):
    assign_perm(
        ProviderPermission.VIEW_OPERATIONS.perm, console_user, Provider.objects.get(name="orders")
    )
    before = snapshot()
    client, response = _console_decision(world, console_user)
    assert_error(response, 403, "forbidden")
    assert_unchanged(before)
    # Seeing what it would approve is viewing: allowed.
    shown = client.get(f"/api/v1/approvals/{world.approval_id}")
    assert (shown.status_code, shown.json()["status"]) == (200, "pending")


def test_to_a_console_user_of_no_provider_an_approval_does_not_exist(world, console_user):
    before = snapshot()
    client, response = _console_decision(world, console_user)
    assert_error(response, 404, "unknown_approval")
    assert_error(client.get(f"/api/v1/approvals/{world.approval_id}"), 404, "unknown_approval")
    assert_unchanged(before)


# -- unknown and foreign things ---------------------------------------------------------


@pytest.mark.parametrize("name", BY_KEY)
def test_another_hosts_operation_is_unknown(world, name):
    endpoint = ENDPOINTS[name]
    before = snapshot()
    response = world.send(endpoint, caller="other_host")
    assert_error(response, 404, "unknown_operation")
    assert_unchanged(before)


def test_another_hosts_permit_is_unknown(world):
    before = snapshot()
    response = world.send(ENDPOINTS["revoke"], caller="other_host")
    assert_error(response, 404, "unknown_permit")
    assert_unchanged(before)
    assert Permit.objects.get(pk=world.permit_id).status == "consumed"


@pytest.mark.parametrize(
    ("name", "key"),
    covering(
        BY_KEY,
        [
            "op-404",
            "bad%20key",
            "-op-1",
            "op-1%0A",
            "op-1%00",
            "op%E2%80%8B1",
            "%ED%A0%80",
            "k" * 201,
        ],
    ),
)
def test_an_unknown_or_impossible_operation_key_is_404(world, name, key):
    before = snapshot()
    response = world.send(ENDPOINTS[name], key=key)
    assert_error(response, 404, "unknown_operation")
    assert_unchanged(before)


@pytest.mark.parametrize(
    "approval_id",
    [
        pytest.param(str(uuid.uuid4()), id="unknown"),
        "not-a-uuid",
        "1234",
        "%00",
        "0" * 33,
        "g" * 32,
    ],
)
def test_an_unknown_or_non_uuid_approval_id_is_404(world, approval_id):
    before = snapshot()
    response = world.send(ENDPOINTS["decision"], approval_id=approval_id)
    assert_error(response, 404, "unknown_approval")
    assert_unchanged(before)


@pytest.mark.parametrize("caller", ["host", "approver"])
@pytest.mark.parametrize(
    "permit_id", [pytest.param(str(uuid.uuid4()), id="unknown"), "not-a-uuid", "%00"]
)
def test_an_unknown_or_non_uuid_permit_id_is_404(world, caller, permit_id):
    before = snapshot()
    response = world.send(ENDPOINTS["revoke"], caller=caller, permit_id=permit_id)
    assert_error(response, 404, "unknown_permit")
    assert_unchanged(before)


def test_registering_at_an_unknown_provider_is_404(world):
    body = {**ENDPOINTS["register"].body(world), "provider": "nowhere"}
    before = snapshot()
    assert_error(world.send(ENDPOINTS["register"], body=body), 404, "unknown_provider")
    assert_unchanged(before)


@pytest.mark.parametrize("provider_name", ["nowhere", "a%00b", "p" * 101, "%20", "HP"])
def test_a_callback_to_an_unknown_provider_is_404(world, provider_name):
    before = snapshot()
    response = world.send(ENDPOINTS["callbacks"], provider=provider_name)
    assert_error(response, 404, "unknown_provider")
    assert_unchanged(before)


@pytest.mark.parametrize("operation_key", ["op-404", "op-1"])
def test_a_signed_callback_for_an_operation_the_provider_does_not_hold_is_404(world, operation_key):
    """op-1 exists, but at another provider: a provider only speaks for its own."""
    body = {**ENDPOINTS["callbacks"].body(world), "operation_key": operation_key}
    before = snapshot()
    response = world.send(ENDPOINTS["callbacks"], body=body)
    assert_error(response, 404, "unknown_operation")
    assert_unchanged(before)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/"),
        ("GET", "/api/v1/"),
        ("GET", "/api/v1/operations/"),
        ("POST", "/api/v1/operations/"),
        ("GET", "/api/v2/operations"),
        ("POST", "/api/v1/operations/op-1/approve"),
        ("POST", "/api/v1/operations/op-1/dispatch/"),
        ("GET", "/api/v1/operations/op-1/result/extra"),
        ("POST", "/api/v1/approvals/x/decide"),
        ("GET", "/api/v1/providers/hp"),
        ("DELETE", "/api/nope"),
    ],
)
def test_an_unknown_url_under_api_is_a_json_404(world, method, path):
    before = snapshot()
    response = world.client.generic(
        method, path, data=b"{}", HTTP_AUTHORIZATION=f"Bearer {world.host.token}"
    )
    assert_error(response, 404, "not_found")
    assert_unchanged(before)


# -- params ----------------------------------------------------------------------------


def register(world: World, params: Any = None, *, raw_params: bytes | None = None) -> Any:
    """Register op-p with ``params`` (or the raw JSON text ``raw_params``)."""
    body = {"key": "op-p", "action": "payment.send", "provider": "orders", "params": "@@"}
    if raw_params is None:
        raw_params = json.dumps(params).encode()
    raw = json.dumps(body).encode().replace(b'"@@"', raw_params)
    return world.send(ENDPOINTS["register"], raw)


def nest(depth: int, leaf: Any = 1, *, arrays: bool = False) -> dict[str, Any]:
    """A params object whose innermost object or array is at ``depth`` (params is 1)."""
    value: Any = {"leaf": leaf}
    for level in range(depth - 1, 0, -1):
        value = [value] if arrays and level % 2 == 0 else {"n": value}
    assert isinstance(value, dict)
    return value


def blob(size: int, char: str = "x") -> dict[str, str]:
    """Params whose canonical form is exactly ``size`` bytes."""
    overhead = len(b'{"blob":""}')
    width = len(char.encode())
    count, rest = divmod(size - overhead, width)
    params = {"blob": char * count + "x" * rest}
    assert len(rfc8785.dumps(params)) == size
    return params


def assert_registered(response: Any, before: Snapshot) -> None:
    assert response.status_code == 201, response.content
    events = assert_only_recorded(before, Operation=1, AuditEvent=1)
    assert [e.kind for e in events] == ["registered"]


@pytest.mark.parametrize("params", [[], [1, 2], "params", 1, 1.5, None, True, False])
def test_params_that_are_not_an_object_are_422_invalid_params(world, params):
    before = snapshot()
    assert_error(register(world, params), 422, "invalid_params")
    assert_unchanged(before)


@pytest.mark.parametrize(
    "params",
    [
        pytest.param(blob(MAX_PARAMS_BYTES), id="exactly-64KiB"),
        pytest.param(blob(MAX_PARAMS_BYTES - 1), id="one-byte-under"),
        pytest.param(blob(MAX_PARAMS_BYTES, "\u00e9"), id="exactly-64KiB-of-two-byte-chars"),
        pytest.param(blob(MAX_PARAMS_BYTES, "\U0001f600"), id="exactly-64KiB-of-emoji"),
    ],
)
def test_params_at_the_size_limit_are_accepted(world, params):
    before = snapshot()
    assert_registered(register(world, params), before)


def test_the_canonical_size_decides_not_the_body_size(world):
    """Pretty-printed and \\u-escaped, the body is far bigger than 64 KiB; canonical is not."""
    params = blob(MAX_PARAMS_BYTES, "\u00e9")
    raw = json.dumps(params, indent=8, ensure_ascii=True).encode()
    assert MAX_PARAMS_BYTES * 2 < len(raw) < MAX_BODY
    before = snapshot()
    assert_registered(register(world, raw_params=raw), before)


@pytest.mark.parametrize(
    "params",
    [
        pytest.param(blob(MAX_PARAMS_BYTES + 1), id="one-byte-over"),
        pytest.param(blob(MAX_PARAMS_BYTES + 1, "\u00e9"), id="one-byte-over-in-two-byte-chars"),
        pytest.param(blob(MAX_PARAMS_BYTES * 3), id="three-times"),
        pytest.param({str(i): i for i in range(12_000)}, id="many-keys"),
    ],
)
def test_params_over_64KiB_canonical_are_413_params_too_large(world, params):
    before = snapshot()
    assert_error(register(world, params), 413, "params_too_large")
    assert_unchanged(before)


@pytest.mark.parametrize(
    "params",
    [
        pytest.param(nest(10), id="objects"),
        pytest.param(nest(10, arrays=True), id="objects-and-arrays"),
        pytest.param(nest(9, leaf={}), id="empty-object-at-10"),
        pytest.param(nest(9, leaf=[1, "two", None, 3.5]), id="array-of-scalars-at-10"),
        pytest.param(nest(10, leaf="scalar"), id="scalar-inside-the-tenth"),
    ],
)
def test_params_ten_levels_deep_are_accepted(world, params):
    before = snapshot()
    assert_registered(register(world, params), before)


@pytest.mark.parametrize(
    "params",
    [
        pytest.param(nest(11), id="objects"),
        pytest.param(nest(11, arrays=True), id="objects-and-arrays"),
        pytest.param(nest(10, leaf={}), id="empty-object-at-11"),
        pytest.param(nest(10, leaf=[]), id="empty-array-at-11"),
        pytest.param(nest(40), id="forty"),
    ],
)
def test_params_eleven_levels_deep_are_422_too_deep(world, params):
    before = snapshot()
    assert_error(register(world, params), 422, "invalid_params", reason="too_deep")
    assert_unchanged(before)


@pytest.mark.parametrize(
    "number", [MAX_SAFE_INTEGER, -MAX_SAFE_INTEGER, 0, -0.0, 1e21, 2.5e-324, 1.7976931348623157e308]
)
def test_numbers_inside_the_safe_domain_are_accepted(world, number):
    before = snapshot()
    assert_registered(register(world, {"n": number}), before)


@pytest.mark.parametrize(
    "raw_number",
    [b"9007199254740992", b"9007199254740993", b"-9007199254740992", b"1" + b"0" * 30],
)
def test_integers_outside_the_safe_domain_are_422_integer_out_of_range(world, raw_number):
    """RFC 8785 writes numbers as IEEE doubles: the accepted domain is ±(2^53 - 1)."""
    before = snapshot()
    response = register(world, raw_params=b'{"n": ' + raw_number + b"}")
    assert_error(response, 422, "invalid_params", reason="integer_out_of_range")
    assert_unchanged(before)


@pytest.mark.parametrize(
    "raw_params",
    [
        b'{"n": 1e400}',
        b'{"n": -1e400}',
        b'{"n": NaN}',
        b'{"n": [Infinity]}',
        b'{"a": {"n": 1e999}}',
    ],
)
def test_non_finite_numbers_in_params_are_400(world, raw_params):
    before = snapshot()
    assert_error(register(world, raw_params=raw_params), 400, "non_finite_number")
    assert_unchanged(before)


@pytest.mark.parametrize(
    "raw_params",
    [
        pytest.param(b'{"s": "a\\u0000b"}', id="NUL-in-value"),
        pytest.param(b'{"a\\u0000": 1}', id="NUL-in-key"),
        pytest.param(b'{"s": "\\ud800"}', id="lone-high-surrogate"),
        pytest.param(b'{"s": "\\udfff"}', id="lone-low-surrogate"),
        pytest.param(b'{"\\ud800": 1}', id="lone-surrogate-in-key"),
        pytest.param(b'{"s": ["ok", {"t": "\\ud83d"}]}', id="nested-lone-surrogate"),
        pytest.param(b'{"s": "\xed\xa0\x80"}', id="lone-surrogate-as-raw-bytes"),
    ],
)
def test_strings_without_a_canonical_form_are_422_invalid_params(world, raw_params):
    before = snapshot()
    assert_error(register(world, raw_params=raw_params), 422, "invalid_params")
    assert_unchanged(before)


def test_a_surrogate_pair_is_a_valid_character(world):
    before = snapshot()
    assert_registered(register(world, raw_params=b'{"s": "\\ud83d\\ude00"}'), before)
    assert Operation.objects.get(key="op-p").params_canonical == '{"s":"\U0001f600"}'


@pytest.mark.parametrize(
    "raw_params",
    [b'{"a": 1, "a": 1}', b'{"a": {"b": 1, "b": 2}}', b'{"a": [{"c": 1, "c": 1}]}'],
)
def test_a_duplicate_key_inside_params_is_400(world, raw_params):
    before = snapshot()
    assert_error(register(world, raw_params=raw_params), 400, "duplicate_key")
    assert_unchanged(before)


def test_reordered_params_register_the_same_operation_again(world):
    """The same params in another spelling are the same action: 200, nothing new."""
    response = register(world, raw_params=b'{ "to":"acct-7",\n"currency":"EUR","amount":1250 }')
    assert response.status_code == 201
    before = snapshot()
    response = register(world, raw_params=b'{"amount":1.25e3,"currency":"EUR","to":"acct-7"}')
    assert response.status_code == 200, response.content
    assert_unchanged(before)


# -- callbacks ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "signature",
    [
        pytest.param(None, id="missing"),
        pytest.param("", id="empty"),
        pytest.param("   ", id="blank"),
        pytest.param("0" * 64, id="zeros"),
        pytest.param("garbage", id="garbage"),
        pytest.param("wrong-secret", id="wrong-secret"),
        pytest.param("other-body", id="signature-of-another-body"),
        pytest.param("sha256=", id="prefixed"),
        pytest.param("\u00e9" * 64, id="non-ascii"),
        pytest.param("f" * 10_000, id="huge"),
    ],
)
def test_a_callback_without_the_right_signature_is_401(world, signature):
    endpoint = ENDPOINTS["callbacks"]
    raw = json.dumps(endpoint.body(world)).encode()
    if signature == "wrong-secret":
        signature = sign(raw, "not-the-secret")
    elif signature == "other-body":
        signature = sign(raw + b" ")
    elif signature == "sha256=":
        signature = "sha256=" + sign(raw)
    elif signature == "":
        signature = " "
    before = snapshot()
    assert_error(world.send(endpoint, raw, signature=signature), 401, "bad_signature")
    assert_unchanged(before)


def test_a_callback_to_a_provider_without_a_secret_is_never_trusted(world):
    endpoint = ENDPOINTS["callbacks"]
    body = {**endpoint.body(world), "operation_key": "op-1"}
    raw = json.dumps(body).encode()
    before = snapshot()
    for signature in (sign(raw, ""), sign(raw), None):
        response = world.send(endpoint, raw, signature=signature, provider="orders")
        assert_error(response, 401, "bad_signature")
    assert_unchanged(before)


def test_the_signature_is_checked_before_the_body_is_parsed(world):
    before = snapshot()
    response = world.send(ENDPOINTS["callbacks"], b"{not json", signature="0" * 64)
    assert_error(response, 401, "bad_signature")
    assert_unchanged(before)


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"", "malformed_json"),
        (b"{not json", "malformed_json"),
        (b"[1, 2]", "invalid_body"),
        (b'{"sequence": 1, "sequence": 2}', "duplicate_key"),
        (b'{"sequence": NaN}', "non_finite_number"),
        (b'{"sequence": 1e400}', "non_finite_number"),
    ],
)
def test_a_validly_signed_malformed_callback_is_400(world, raw, code):
    before = snapshot()
    assert_error(world.send(ENDPOINTS["callbacks"], raw), 400, code)
    assert_unchanged(before)


def test_a_valid_callback_is_applied_so_the_refusals_above_are_real(world):
    """Control: the same endpoint and signature scheme does accept a good notification."""
    response = world.send(ENDPOINTS["callbacks"])
    assert response.status_code == 200, response.content
    assert Evidence.objects.filter(operation__key="op-h").count() == 1


# -- replays and stale requests -------------------------------------------------------


@pytest.mark.parametrize("decision", ["approve", "deny"])
def test_deciding_an_already_decided_approval_is_409_already_decided(world, decision):
    before = snapshot()
    response = world.send(
        ENDPOINTS["decision"],
        body={"decision": decision, "params_digest": digest_of(PARAMS)},
        approval_id=world.decided_approval_id,
    )
    assert_error(response, 409, "already_decided", status="approved")
    assert_unchanged(before)


def test_a_denied_approval_cannot_be_approved_afterwards(world):
    endpoint = ENDPOINTS["decision"]
    denied = world.send(endpoint, body={"decision": "deny", "params_digest": digest_of(PARAMS)})
    assert denied.status_code == 200, denied.content
    before = snapshot()
    response = world.send(
        endpoint, body={"decision": "approve", "params_digest": digest_of(PARAMS)}
    )
    assert_error(response, 409, "already_decided", status="denied")
    assert_unchanged(before)


def test_dispatch_after_consumption_records_only_the_refusal(world):
    before = snapshot()
    response = world.send(ENDPOINTS["dispatch"])
    assert_error(response, 409, "already_consumed", execution_state="dispatched")
    events = assert_only_recorded(before, PermitEvent=1, AuditEvent=1)
    assert [(e.kind, e.data["code"]) for e in events] == [("consume_refused", "already_consumed")]
    refusal = PermitEvent.objects.order_by("-id").first()
    assert (refusal.kind, refusal.reason) == ("refused", "already_consumed")


def test_dispatch_without_a_permit_records_only_the_refusal(world):
    before = snapshot()
    response = world.send(ENDPOINTS["dispatch"], key="op-2")
    assert_error(response, 409, "not_authorized")
    events = assert_only_recorded(before, AuditEvent=1)
    assert [(e.kind, e.data["code"]) for e in events] == [("consume_refused", "not_authorized")]


def test_dispatch_with_another_digest_records_only_the_refusal(world, flow):
    flow.approved("op-3")
    before = snapshot()
    body = {"worker": "w9", "params_digest": digest_of({**PARAMS, "amount": 1})}
    response = world.send(ENDPOINTS["dispatch"], body=body, key="op-3")
    assert_error(response, 409, "action_mismatch")
    events = assert_only_recorded(before, PermitEvent=1, AuditEvent=1)
    assert [(e.kind, e.data["code"]) for e in events] == [("consume_refused", "action_mismatch")]


@pytest.mark.parametrize("name", ["heartbeat", "result"])
@pytest.mark.parametrize(
    ("key", "token"),
    [
        pytest.param("op-1", "forged", id="forged"),
        pytest.param("op-1", "A" * 32, id="well-formed-but-wrong"),
        pytest.param("op-2", None, id="anothers-token-on-an-undispatched-operation"),
    ],
)
def test_a_wrong_fencing_token_records_only_a_stale_signal(world, name, key, token):
    endpoint = ENDPOINTS[name]
    body = {**endpoint.body(world), "fencing_token": token or world.fencing_token}
    before = snapshot()
    response = world.send(endpoint, body=body, key=key)
    assert_error(response, 409, "stale_fencing_token")
    events = assert_only_recorded(before, AuditEvent=1)
    assert [(e.kind, e.data["signal"]) for e in events] == [("stale_signal", "stale_fencing_token")]


def test_a_heartbeat_after_the_lease_was_lost_is_409_lease_lost(world, flow):
    Dispatch.objects.update(lease_expires_at=timezone.now() - timedelta(minutes=5))
    assert flow.resume("op-1")["state"] == "unknown"
    before = snapshot()
    response = world.send(ENDPOINTS["heartbeat"])
    assert_error(response, 409, "lease_lost", state="unknown")
    events = assert_only_recorded(before, AuditEvent=1)
    assert [(e.kind, e.data["signal"]) for e in events] == [
        ("stale_signal", "heartbeat_after_lease")
    ]


@pytest.mark.parametrize(("key", "state"), [("op-1", "dispatched"), ("op-3", "denied")])
def test_opening_an_approval_on_an_operation_not_awaiting_one_is_409(world, flow, key, state):
    if key == "op-3":
        flow.register("op-3")
        approval = world.host.post("/api/v1/operations/op-3/approvals").json()
        denied = world.approver.post(
            f"/api/v1/approvals/{approval['approval_id']}/decision",
            {"decision": "deny", "params_digest": digest_of(PARAMS)},
        )
        assert denied.status_code == 200
    before = snapshot()
    response = world.send(ENDPOINTS["approvals"], key=key)
    assert_error(response, 409, "invalid_state", state=state)
    assert_unchanged(before)


def test_a_decision_on_an_operation_that_moved_on_changes_nothing_but_is_recorded(world):
    """The approval is still pending but its operation is no longer awaiting approval."""
    Operation.objects.filter(key="op-2").update(state="expired")
    before = snapshot()
    response = world.send(ENDPOINTS["decision"])
    assert_error(response, 409, "stale_state", state="expired")
    events = assert_only_recorded(before, AuditEvent=1)
    assert [(e.kind, e.data["signal"]) for e in events] == [("stale_signal", "transition_refused")]
    assert Approval.objects.get(pk=world.approval_id).status == "pending"


@pytest.mark.parametrize("caller", ["host", "other_host"])
def test_the_same_key_with_a_different_action_is_409_key_conflict(world, caller):
    body = {"key": "op-1", "action": "payment.send", "provider": "orders", "params": {"x": 1}}
    before = snapshot()
    assert_error(world.send(ENDPOINTS["register"], body=body, caller=caller), 409, "key_conflict")
    assert_unchanged(before)


# -- never a 500 ------------------------------------------------------------------------


GARBAGE = [
    b"",
    b" ",
    b"\x00",
    b"\x00" * 64,
    b"{",
    b"}",
    b"{}}",
    b"{}{}",
    b"[",
    b"]",
    b'"',
    b"\\",
    b"nul",
    b"undefined",
    b"\xff" * 16,
    b"\xef\xbb\xbf",
    b"\xef\xbb\xbf{}",
    b"\xfe\xff\x00{\x00}",
    b"\xed\xa0\x80",
    b'{"a": "\xed\xa0\x80"}',
    b'{"\xed\xa0\x80": 1}',
    b"<xml/>",
    b"a=1&b=2",
    b"--xyz\r\nContent-Disposition: form-data; name=a\r\n\r\n1\r\n--xyz--",
    b"[" * 50_000,
    b"{" * 50_000,
    b'{"a":' * 50_000,
    b"9" * 100_000,
    b'{"a": ' + b"9" * 100_000 + b"}",
    b'{"a": 1e' + b"9" * 1000 + b"}",
    b'{"a": -0.0000000000000000000000000001e-99999}',
    b'{"' + b"k" * 100_000 + b'": 1}',
    b'{"params": {"a": {"$ref": "#"}}, "key": [], "action": {}, "provider": null}',
    b'{"fencing_token": {"$gt": ""}, "worker": ["w"], "sequence": {"n": 1}}',
    b'{"decision": "approve", "ttl_seconds": 1e308}',
    b'{"decision": "approve", "ttl_seconds": -9223372036854775809}',
    b'{"sequence": 18446744073709551616}',
    b'{"reason": "\\ud800\\ud800"}',
    bytes(range(256)),
]


@pytest.mark.parametrize("name", list(ENDPOINTS))
def test_no_garbage_body_ever_gets_a_500_or_writes_anything(world, name):
    endpoint = ENDPOINTS[name]
    before = snapshot()
    for raw in GARBAGE:
        for content_type in ("application/json", "text/plain", ""):
            response = world.send(endpoint, raw, content_type=content_type)
            assert response.status_code < 500, (raw[:40], content_type, response.content)
            if response.status_code >= 400:
                assert_error(response, response.status_code, response.json()["error"])
    assert_unchanged(before)
