"""The client computes the params digest as Settle does, without Settle's code.

settle_client must not import canonical; here both meet on many inputs: the
same digest for every params object Settle accepts, and a refusal, with the same reason,
for every one it refuses.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import settle_client
from hypothesis import given, settings
from hypothesis import strategies as st
from settle_client import canonical as client

from common import canonical as server

MAX = 2**53 - 1
# Every top-level package of the server (pyproject.toml's wheel packages).
SETTLE_PACKAGES = {
    "approvals",
    "audit",
    "common",
    "console",
    "dbsql",
    "monitoring",
    "recovery",
    "settle",
    "webhooks",
}
SOURCE = Path(settle_client.__file__).parent

text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-MAX, MAX)
    | st.floats(allow_nan=False, allow_infinity=False).filter(
        lambda f: not (f.is_integer() and MAX < abs(f) < 1e21)
    )
    | text
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=20,
)
params_objects = st.dictionaries(text, values, max_size=6)


def server_digest(params: Any) -> str:
    return server.params_digest(server.canonical_params(params))


@settings(max_examples=600, deadline=None)
@given(params_objects)
def test_client_and_server_give_the_same_digest(params: dict[str, Any]) -> None:
    assert client.params_digest(params) == server_digest(params)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(text, st.floats(allow_nan=False, allow_infinity=False), max_size=4))
def test_every_float_is_written_as_rfc8785_writes_it(params: dict[str, float]) -> None:
    try:
        expected = server.canonical_params(params).encode("utf-8")
    except server.CanonicalError as exc:
        with pytest.raises(client.CanonicalError) as refused:
            client.canonical_params(params)
        assert refused.value.reason == exc.code
        return
    assert client.canonical_params(params) == expected


@pytest.mark.parametrize(
    "params",
    [
        {"n": MAX + 1},
        {"n": -MAX - 1},
        {"n": float(2**53)},
        {"n": float("nan")},
        {"n": float("inf")},
        {"s": "a\x00b"},
        {"s": "\ud800"},
        {1: "key not text"},
        {"deep": [[[[[[[[[[["eleven"]]]]]]]]]]]},
        {"big": "x" * (64 * 1024)},
        {"set": {1, 2}},
        [],
    ],
    ids=lambda p: repr(p)[:30],
)
def test_what_the_server_refuses_the_client_refuses_with_the_same_reason(params: Any) -> None:
    with pytest.raises(server.CanonicalError) as refused_by_server:
        server.canonical_params(params)
    with pytest.raises(client.CanonicalError) as refused_by_client:
        client.canonical_params(params)
    assert refused_by_client.value.reason == refused_by_server.value.code


@pytest.mark.parametrize(
    "params",
    [
        {"amount": 1250, "currency": "EUR"},
        {"\u20ac": 1, "\U0001f600": 2, "z": 3, "a": [1.5, -0.0, 1e21, 1e-7, 5e-324]},
        {"s": '\u2028\u2029\x7f\x1f"\\/'},
        {"nested": [{"b": None, "a": True}, [], {}]},
    ],
)
def test_known_inputs_give_the_same_digest(params: dict[str, Any]) -> None:
    assert client.params_digest(params) == server_digest(params)


def test_the_client_imports_nothing_of_settle() -> None:
    for path in SOURCE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            for name in names:
                top = name.split(".")[0]
                assert top not in SETTLE_PACKAGES | {"django"}, (path, name)
                assert top not in {"rfc8785", "pydantic"}, (path, name)


def test_every_code_the_api_answers_has_its_exception_in_the_client():
    """Also checked against a live server's document in the client's own venv; here in
    ``make test``, so that a code added to the server without its class fails at once."""
    from settle_client import errors

    from common.errors import ErrorCode

    assert sorted(errors.ERRORS_BY_CODE) == sorted(code.value for code in ErrorCode if code.api)
