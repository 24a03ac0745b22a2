"""An error answer becomes its typed exception, whatever its details are named, without a server."""

from __future__ import annotations

import httpx
import pytest
from settle_client import Host, errors


def _host(response: httpx.Response) -> Host:
    transport = httpx.MockTransport(lambda request: response)
    return Host("http://settle.test", "stt_x", transport=transport, retries=0)


def test_a_detail_named_status_is_a_detail_not_the_http_status():
    body = {"error": "already_consumed", "message": "m", "status": "consumed", "code": "c"}
    with (
        _host(httpx.Response(409, json=body)) as host,
        pytest.raises(errors.PermitRefused) as caught,
    ):
        host.operation("op-1")
    assert (caught.value.status, caught.value.code) == (409, "already_consumed")
    assert caught.value.details == {"status": "consumed", "code": "c"}


def test_an_unknown_code_keeps_its_group_and_its_details():
    body = {"error": "something_new", "message": "m", "status": "revoked", "permit_id": "p"}
    with (
        _host(httpx.Response(404, json=body)) as host,
        pytest.raises(errors.NotFoundError) as caught,
    ):
        host.operation("op-1")
    assert (caught.value.status, caught.value.code, caught.value.message) == (
        404,
        "something_new",
        "m",
    )
    assert caught.value.details == {"status": "revoked", "permit_id": "p"}
