"""An operation's params: the canonical size and depth, the safe numbers, or a refusal."""

from __future__ import annotations

import json
from typing import Any

import pytest
import rfc8785

from common.canonical import MAX_PARAMS_BYTES, MAX_SAFE_INTEGER
from recovery.models import Operation
from tests.support.bad_input import (
    ENDPOINTS,
    MAX_BODY,
    Snapshot,
    World,
    assert_error,
    assert_only_recorded,
    assert_unchanged,
    snapshot,
)

pytestmark = pytest.mark.django_db


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
