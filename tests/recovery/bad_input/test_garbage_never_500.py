"""No garbage body ever gets a 500 or writes anything."""

from __future__ import annotations

import pytest

from tests.support.bad_input import (
    ENDPOINTS,
    assert_error,
    assert_unchanged,
    snapshot,
)

pytestmark = pytest.mark.django_db


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
