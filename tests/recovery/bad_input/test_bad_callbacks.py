"""A provider's callback: its signature is checked first, then its body."""

from __future__ import annotations

import json

import pytest

from recovery.models import Evidence
from tests.support.bad_input import (
    ENDPOINTS,
    assert_error,
    assert_unchanged,
    sign,
    snapshot,
)

pytestmark = pytest.mark.django_db


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
