"""Canonical JSON (RFC 8785) and the params digest."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
import rfc8785
from hypothesis import given
from hypothesis import strategies as st

from common.canonical import (
    MAX_PARAMS_BYTES,
    CanonicalError,
    canonical_dumps,
    canonical_params,
    canonical_plain,
    canonical_plain_dumps,
    params_digest,
    plain_loads,
    strict_loads,
)
from recovery.models import State


def test_digest_is_sha256_of_the_canonical_text():
    canonical = canonical_params({"b": [1, 2.5, "x"], "a": {"z": None, "y": True}})
    assert canonical == '{"a":{"y":true,"z":null},"b":[1,2.5,"x"]}'
    expected = "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
    assert params_digest(canonical) == expected


def test_numbers_take_their_shortest_form():
    assert canonical_params({"n": 1.0, "m": 1e21, "k": 0.000001}) == (
        '{"k":0.000001,"m":1e+21,"n":1}'
    )


def _nested(depth: int) -> dict:
    """An object ``depth`` objects deep (the params object itself counts as one)."""
    nested: dict = {"leaf": 1}
    for _ in range(depth - 1):
        nested = {"x": nested}
    return nested


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ([1, 2], "invalid_params"),
        ({"n": 2**53}, "integer_out_of_range"),
        ({"n": -(2**53)}, "integer_out_of_range"),
        ({"n": 2.0**53}, "integer_out_of_range"),
        ({"n": float("nan")}, "non_finite_number"),
        ({"s": "a\x00b"}, "invalid_params"),
        ({"s": "\ud800"}, "invalid_params"),
        (_nested(11), "too_deep"),
        ({"list": [[[[[[[[[[1]]]]]]]]]]}, "too_deep"),
        ({"blob": "x" * MAX_PARAMS_BYTES}, "params_too_large"),
    ],
)
def test_values_without_a_canonical_form_are_refused(params, code):
    with pytest.raises(CanonicalError) as error:
        canonical_params(params)
    assert error.value.code == code


def test_depth_ten_and_the_largest_safe_integer_are_accepted():
    canonical_params(_nested(10))
    canonical_params({"n": 2**53 - 1, "m": -(2**53) + 1, "big": 1e21})


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ('{"a": 1, "a": 2}', "duplicate_key"),
        ('{"a": {"b": 1, "b": 1}}', "duplicate_key"),
        ('{"a": NaN}', "non_finite_number"),
        ('{"a": -Infinity}', "non_finite_number"),
        ('{"a": 1e400}', "non_finite_number"),
        ('{"a": ', "malformed_json"),
        (b'{"a": "\xff"}', "malformed_json"),
    ],
)
def test_strict_parsing_refuses_ambiguous_json(text, code):
    with pytest.raises(CanonicalError) as error:
        strict_loads(text)
    assert error.value.code == code


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.text(max_size=8)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=12,
)


@given(st.dictionaries(st.text(max_size=5), json_values, max_size=4))
def test_canonical_text_round_trips_to_the_same_digest(params):
    try:
        canonical = canonical_params(params)
    except CanonicalError as error:
        assert error.code in {"invalid_params", "too_deep", "integer_out_of_range"}
        return
    again = canonical_params(strict_loads(canonical))
    assert again == canonical


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**60), max_value=2**60)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)


@given(value=_JSON)
def test_canonical_bytes_are_exactly_rfc8785s_whichever_encoder_writes_them(value: Any) -> None:
    """The fast path for plain values must not change a single hashed byte."""
    try:
        expected = rfc8785.dumps(value)
    except Exception as exc:
        with pytest.raises(type(exc)):
            canonical_dumps(value)
        return
    assert canonical_dumps(value) == expected


@given(
    value=st.recursive(
        st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text(),
        lambda children: (
            st.lists(children, max_size=4)
            | st.dictionaries(st.text(max_size=6), children, max_size=4)
        ),
        max_leaves=12,
    )
)
def test_plain_values_with_any_text_match_rfc8785(value: Any) -> None:
    """Every string, control characters and astral planes included (sorting, escapes)."""
    assert canonical_dumps(value) == rfc8785.dumps(value)


def test_an_enum_member_is_written_as_its_text() -> None:
    assert canonical_dumps({"to": State.RELEASED, "n": 1}) == rfc8785.dumps(
        {"to": "released", "n": 1}
    )


@given(value=_JSON)
def test_plain_loads_parses_as_json_loads_and_knows_whether_the_value_is_plain(
    value: Any,
) -> None:
    """What the audit verification relies on to skip ``canonical_plain``'s walk: the same value,
    the same verdict, and so the same bytes as RFC 8785 wherever it says plain."""
    text = json.dumps(value, ensure_ascii=False)
    loaded, plain = plain_loads(text)
    assert loaded == json.loads(text)
    assert plain is canonical_plain(json.loads(text))
    if plain:
        assert canonical_plain_dumps(loaded) == rfc8785.dumps(loaded)


@pytest.mark.parametrize(
    ("text", "plain"),
    [
        ('{"a": 1, "b": [true, null, "x.5e3"]}', True),
        ('{"a": 1.0}', False),
        ("[1e3]", False),
        ('{"n": 9007199254740991}', True),
        ('{"n": -9007199254740992}', False),
        ("[NaN, 1]", False),
        ('{"x": -Infinity}', False),
        ('{"ü": "\\u00e9"}', True),
    ],
)
def test_plain_loads_sees_floats_and_unsafe_integers(text: str, plain: bool) -> None:
    assert plain_loads(text) == (json.loads(text), plain)
