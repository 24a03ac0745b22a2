"""Malformed bodies, wrong fields and content types: 400, 413, 415 or 422, nothing written."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from approvals.models import Permit
from tests.support.bad_input import (
    DIGEST,
    ENDPOINTS,
    MAX_BODY,
    POSTS,
    WITH_FIELDS,
    assert_error,
    assert_unchanged,
    covering,
    snapshot,
    with_duplicate,
)

pytestmark = pytest.mark.django_db


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
